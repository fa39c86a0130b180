#include "loadtest/cli_args.h"

namespace pd::loadtest {

std::vector<std::string> UndashFlagNames(const std::vector<std::string>& args) {
  std::vector<std::string> out;
  out.reserve(args.size());
  bool positional_only = false;
  for (size_t i = 0; i < args.size(); ++i) {
    std::string arg = args[i];
    const bool is_flag = arg.size() >= 2 && arg[0] == '-' && arg != "--";
    if (i > 0 && !positional_only && arg == "--") {
      positional_only = true;
    } else if (i > 0 && !positional_only && is_flag) {
      const size_t name_begin = arg[1] == '-' ? 2 : 1;
      const size_t eq = arg.find('=');
      const size_t name_end = eq == std::string::npos ? arg.size() : eq;
      for (size_t j = name_begin; j < name_end; ++j) {
        if (arg[j] == '-') {
          arg[j] = '_';
        }
      }
    }
    out.push_back(std::move(arg));
  }
  return out;
}

}  // namespace pd::loadtest
