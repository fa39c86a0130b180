// What every service main() shares: one-line fatal startup errors and flag parsing.
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace pd::services {

// Parses absl flags (with `usage` shown by --help) and initialises logging. Unknown flags and
// invalid values print one "ERROR: ..." line and exit(1) (absl's behaviour). Returns the
// positional arguments (argv[0] first).
std::vector<char*> ParseFlagsAndInitLogging(int argc, char** argv, absl::string_view usage);

// ParseFlagsAndInitLogging for the CLIs that accept dashed flag names (pd-loadtest,
// pd-routesim): "--slo-ttft-ms=50" is read as --slo_ttft_ms=50 (common/base/dashed_flags.h).
// These CLIs take no positional arguments, so none are returned.
void ParseDashedFlagsAndInitLogging(int argc, char** argv, absl::string_view usage);

// Prints "<program>: error: <message> (<code>)" on one line to stderr and exits with status 1.
// For startup failures (bad config, port in use, unreachable dependency): an operator error,
// not a crash, so no stack trace.
[[noreturn]] void ExitWithStartupError(absl::string_view program, const absl::Status& status);

}  // namespace pd::services
