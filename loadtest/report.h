// Reports of a load test: the JSON summary, the per-request CSV and the text table.
//
// JSON keys follow vLLM's `bench serve` result file where they overlap (completed, duration,
// request_throughput, mean_ttft_ms, p99_itl_ms, ...); see docs/loadtest.md for the full list.
// Pure formatting plus file writing; thread-compatible.
#pragma once

#include <cstdint>
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

// Writes `contents` to `path` (via a temporary file renamed into place). Internal/NotFound with
// the path and errno text on failure.
absl::Status WriteFile(const std::string& path, const std::string& contents);

}  // namespace pd::loadtest
