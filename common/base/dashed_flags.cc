#include "common/base/dashed_flags.h"

#include "absl/strings/match.h"

namespace pd {

std::string UndashFlag(absl::string_view arg) {
  // A flag argument: "-x..." or "--x...", but not "-" or "--" alone.
  if (arg.size() < 2 || arg[0] != '-' || arg == "--") {
    return std::string(arg);
  }
  const size_t dashes = absl::StartsWith(arg, "--") ? 2 : 1;
  const size_t eq = arg.find('=');
  const size_t name_end = eq == absl::string_view::npos ? arg.size() : eq;
  std::string out(arg);
  for (size_t i = dashes; i < name_end; ++i) {
    if (out[i] == '-') {
      out[i] = '_';
    }
  }
  return out;
}

std::vector<std::string> UndashFlagNames(const std::vector<std::string>& args) {
  std::vector<std::string> out;
  out.reserve(args.size());
  bool positional_only = false;
  for (size_t i = 0; i < args.size(); ++i) {
    if (i == 0 || positional_only) {
      out.push_back(args[i]);
    } else {
      positional_only = args[i] == "--";
      out.push_back(UndashFlag(args[i]));
    }
  }
  return out;
}

UndashedArgv::UndashedArgv(int argc, char** argv)
    : args_(UndashFlagNames(std::vector<std::string>(argv, argv + argc))) {
  argv_.reserve(args_.size() + 1);
  for (std::string& a : args_) {
    argv_.push_back(a.data());
  }
  argv_.push_back(nullptr);
}

}  // namespace pd
