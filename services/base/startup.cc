#include "services/base/startup.h"

#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"
#include "absl/status/status.h"
#include "common/base/dashed_flags.h"
#include "common/log/log.h"

namespace pd::services {

std::vector<char*> ParseFlagsAndInitLogging(int argc, char** argv, absl::string_view usage) {
  absl::SetProgramUsageMessage(usage);
  // --help lists every flag defined outside Abseil itself (absl matches on the binary's file
  // name by default, which finds nothing for main.cc files).
  absl::FlagsUsageConfig usage_config;
  usage_config.contains_help_flags = [](absl::string_view path) {
    return !absl::StrContains(path, "absl/");
  };
  usage_config.contains_helpshort_flags = usage_config.contains_help_flags;
  absl::SetFlagsUsageConfig(usage_config);
  std::vector<char*> positional = absl::ParseCommandLine(argc, argv);
  InitLogging(argv[0]);
  return positional;
}

void ParseDashedFlagsAndInitLogging(int argc, char** argv, absl::string_view usage) {
  UndashedArgv undashed(argc, argv);
  ParseFlagsAndInitLogging(undashed.argc(), undashed.argv(), usage);
}

void ExitWithStartupError(absl::string_view program, const absl::Status& status) {
  std::string line = std::string(program) + ": error: " + std::string(status.message()) + " (" +
                     absl::StatusCodeToString(status.code()) + ")\n";
  std::fputs(line.c_str(), stderr);
  std::fflush(stderr);
  std::exit(1);
}

}  // namespace pd::services
