#include "loadtest/cli_args.h"

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

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

absl::StatusOr<std::vector<std::string>> ParseNameList(absl::string_view flag,
                                                       absl::string_view text) {
  std::vector<std::string> out;
  if (absl::StripAsciiWhitespace(text).empty()) {
    return absl::InvalidArgumentError(absl::StrCat("--", flag, " is empty"));
  }
  for (absl::string_view item : absl::StrSplit(text, ',')) {
    item = absl::StripAsciiWhitespace(item);
    if (item.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", flag, " has an empty item: '", text, "'"));
    }
    out.emplace_back(item);
  }
  return out;
}

absl::StatusOr<std::vector<double>> ParseDoubleList(absl::string_view flag,
                                                    absl::string_view text) {
  absl::StatusOr<std::vector<std::string>> items = ParseNameList(flag, text);
  if (!items.ok()) {
    return items.status();
  }
  std::vector<double> out;
  for (const std::string& item : *items) {
    double v = 0;
    if (!absl::SimpleAtod(item, &v)) {
      return absl::InvalidArgumentError(absl::StrCat("--", flag, ": '", item, "' is not a number"));
    }
    out.push_back(v);
  }
  return out;
}

absl::StatusOr<std::vector<int64_t>> ParseIntList(absl::string_view flag, absl::string_view text) {
  absl::StatusOr<std::vector<std::string>> items = ParseNameList(flag, text);
  if (!items.ok()) {
    return items.status();
  }
  std::vector<int64_t> out;
  for (const std::string& item : *items) {
    int64_t v = 0;
    if (!absl::SimpleAtoi(item, &v)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", flag, ": '", item, "' is not an integer"));
    }
    out.push_back(v);
  }
  return out;
}

}  // namespace pd::loadtest
