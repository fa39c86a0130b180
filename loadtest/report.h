// Reports of a load test: the JSON summary, the per-request CSV and the text table.
//
// JSON keys follow vLLM's `bench serve` result file where they overlap (completed, duration,
// request_throughput, mean_ttft_ms, p99_itl_ms, ...); see docs/loadtest.md for the full list.
// Pure formatting plus file writing; thread-compatible.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "loadtest/metrics.h"

namespace pd::loadtest {

// What was run, copied into the JSON report under "config" and printed above the table.
struct RunInfo {
  std::string target;
  std::string model;
  std::string workload;
  std::string arrival;
  int64_t concurrency = 0;  // 0 = unbounded (open loop)
  double request_rate = 0;  // 0 = not open loop
  double burstiness = 1;
  uint64_t seed = 0;
  int64_t num_requests = 0;     // the bound; 0 = none
  double duration_bound_s = 0;  // 0 = none
  std::string started_at;       // RFC 3339, UTC
  bool interrupted = false;     // stopped by Ctrl-C (partial report)
  int64_t max_in_flight = 0;    // most requests in flight at once
  // Workload-specific settings ("input_len" -> "uniform:64,256", "trace" -> path, ...).
  std::vector<std::pair<std::string, std::string>> workload_options;
};

// The JSON summary (an object, pretty-printed with 2-space indents, ending with a newline).
std::string SummaryJson(const Summary& summary, const RunInfo& info);

// The CSV of per-request records: a header line, then one line per record in workload order.
// Columns: index,source_line,scheduled_ms,start_ms,ttft_ms,tpot_ms,e2el_ms,input_tokens,
// max_tokens,output_tokens,prompt_tokens,cached_tokens,completion_tokens,finish_reason,status,
// error. Undefined latencies are empty; `error` is quoted as CSV requires.
std::string RecordsCsv(const std::vector<RequestRecord>& records);

// The human-readable summary table (what pd-loadtest prints to stdout).
std::string SummaryTable(const Summary& summary, const RunInfo& info);

// One run of a comparison or sweep: its summary and what was run.
struct LabeledSummary {
  std::string label;  // "A", "B"; "rate=2"
  Summary summary;
  RunInfo info;
};

// One metric of a comparison: A's and B's values and B / A (nullopt when A's value is 0 or
// either is undefined, e.g. a hit ratio without usage). `higher_is_better` says which
// direction of the ratio favours B (throughputs, hit ratio) or A (latencies).
struct MetricRatio {
  std::string name;  // the JSON key: "request_throughput", "mean_ttft_ms", ...
  std::optional<double> a;
  std::optional<double> b;
  std::optional<double> ratio;
  bool higher_is_better = false;
};

// The compared metrics: request, output and total token throughput, goodput (with an SLO),
// mean/median/p99 of TTFT, TPOT, ITL and E2EL, prefix_cache_hit_ratio, completed, failed.
std::vector<MetricRatio> CompareMetrics(const Summary& a, const Summary& b);

// {"mode": "compare", "a": SummaryJson(a), "b": SummaryJson(b), "ratios": {name: B/A or null}}.
std::string CompareJson(const LabeledSummary& a, const LabeledSummary& b);

// A compared sweep, one (A, B) pair per rate: {"mode": "compare_sweep", "request_rates": [...],
// "a": [SummaryJson per rate], "b": [...], "ratios": [{name: B/A or null} per rate]}.
std::string CompareSweepJson(const std::vector<std::pair<LabeledSummary, LabeledSummary>>& pairs);

// The ratio table printed after both summaries: metric, A, B, B/A.
std::string CompareTable(const LabeledSummary& a, const LabeledSummary& b);

// {"mode": "sweep", "request_rates": [...], "runs": [SummaryJson per rate]}.
std::string SweepJson(const std::vector<LabeledSummary>& runs);

// One line per rate: offered rate, request and output throughput, goodput, TTFT mean/p99.
std::string SweepTable(const std::vector<LabeledSummary>& runs);

// Writes `contents` to `path` (via a temporary file renamed into place). Internal/NotFound with
// the path and errno text on failure.
absl::Status WriteFile(const std::string& path, const std::string& contents);

}  // namespace pd::loadtest
