// Command-line spelling: pd-loadtest accepts dashed flag names (--slo-ttft-ms, as vLLM and the
// issue spell them) as well as absl's underscore names (--slo_ttft_ms).
#pragma once

#include <string>
#include <vector>

namespace pd::loadtest {

// Rewrites the name part of every flag argument from dashes to underscores, leaving values
// alone: "--slo-ttft-ms=50" -> "--slo_ttft_ms=50", "-on-bad-line" -> "-on_bad_line",
// "--workload=shared-prefix" unchanged. Non-flag arguments and everything after "--" are
// returned unchanged; args[0] (the program) too.
std::vector<std::string> UndashFlagNames(const std::vector<std::string>& args);

}  // namespace pd::loadtest
