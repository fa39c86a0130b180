// Command-line spelling: pd-loadtest accepts dashed flag names (--slo-ttft-ms, as vLLM and the
// issue spell them) as well as absl's underscore names (--slo_ttft_ms).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace pd::loadtest {

// Rewrites the name part of every flag argument from dashes to underscores, leaving values
// alone: "--slo-ttft-ms=50" -> "--slo_ttft_ms=50", "-on-bad-line" -> "-on_bad_line",
// "--workload=shared-prefix" unchanged. Non-flag arguments and everything after "--" are
// returned unchanged; args[0] (the program) too.
std::vector<std::string> UndashFlagNames(const std::vector<std::string>& args);

// Comma-separated lists of list flags ("1,2,4,8"; spaces around items allowed). `flag` names
// the flag in errors. InvalidArgument for an empty list, an empty item or a malformed number.
absl::StatusOr<std::vector<double>> ParseDoubleList(absl::string_view flag, absl::string_view text);
absl::StatusOr<std::vector<int64_t>> ParseIntList(absl::string_view flag, absl::string_view text);
// The same for names ("cache_aware,round_robin"); items are not checked.
absl::StatusOr<std::vector<std::string>> ParseNameList(absl::string_view flag,
                                                       absl::string_view text);

}  // namespace pd::loadtest
