// Reports of pd-routesim: a JSON document and a text table of RouteSimResults (one per policy and
// worker count). Field meanings are in docs/loadtest.md ("Router simulator"). Pure formatting;
// thread-compatible.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "loadtest/sim/route_sim.h"

namespace pd::loadtest::sim {

// What was simulated, for the JSON's "config".
struct RouteSimRunInfo {
  std::string trace;  // path
  int64_t trace_records = 0;
  int64_t trace_skipped_lines = 0;
  int64_t trace_capped_requests = 0;
  double time_scale = 1;
  int64_t max_input_len = 0;
  RouteSimConfig base;  // policy and num_workers vary per result
  std::string started_at;
};

// The hit ratio of the pooled result with the same worker count, or a negative value when
// there is none.
double PooledHitRatio(const std::vector<RouteSimResult>& results, int num_workers);

// {"config": {...}, "results": [{"policy", "num_workers", "hit_ratio" (local hits only),
// "hit_ratio_with_remote" (local + fetched), "hit_ratio_vs_pooled" (hit_ratio_with_remote over
// pooled's hit_ratio), "fetched_tokens", "fetched_blocks", "fetches", "mean_fetch_ms",
// "fetch_share_of_ttft", "recompute_chosen", "prefill_imbalance", "request_imbalance",
// "mean_ttft_ms", ..., "workers": [...]}, ...]}, pretty-printed, ending with a newline.
std::string RouteSimJson(const std::vector<RouteSimResult>& results, const RouteSimRunInfo& info);

// One row per result, grouped by worker count.
std::string RouteSimTable(const std::vector<RouteSimResult>& results);

}  // namespace pd::loadtest::sim
