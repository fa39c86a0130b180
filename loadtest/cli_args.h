// Command-line list values of pd-loadtest and pd-routesim. (Dashed flag names such as
// --slo-ttft-ms are rewritten by UndashFlagNames, common/base/dashed_flags.h.)
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace pd::loadtest {

// Comma-separated lists of list flags ("1,2,4,8"; spaces around items allowed). `flag` names
// the flag in errors. InvalidArgument for an empty list, an empty item or a malformed number.
absl::StatusOr<std::vector<double>> ParseDoubleList(absl::string_view flag, absl::string_view text);
absl::StatusOr<std::vector<int64_t>> ParseIntList(absl::string_view flag, absl::string_view text);
// The same for names ("cache_aware,round_robin"); items are not checked.
absl::StatusOr<std::vector<std::string>> ParseNameList(absl::string_view flag,
                                                       absl::string_view text);

}  // namespace pd::loadtest
