#include "loadtest/cli_args.h"

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace pd::loadtest {

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
