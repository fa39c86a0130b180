// Per-request records of a load test and the summary computed from them. Definitions (also in
// docs/loadtest.md; names follow vLLM's `bench serve` where they overlap):
//
//   TTFT   first message carrying a token - request sent, per successful request.
//   E2EL   end of the stream (final status) - request sent, per successful request.
//   TPOT   (E2EL - TTFT) / (n - 1), per successful request with n > 1 output tokens.
//   ITL    gaps between consecutive token arrivals, pooled over all successful requests; a
//          message carrying k tokens after a gap g contributes k samples g / k; tokens that
//          arrive with the first token contribute none.
//   stats  mean, median (p50), p90, p95, p99 (percentiles with linear interpolation, numpy's
//          default), in milliseconds.
//   duration                 first send -> last completion of the run.
//   request_throughput       completed / duration (completed = final status OK).
//   output_throughput        output tokens of completed requests / duration.
//   total_token_throughput   (input + output tokens of completed requests) / duration.
//   request_goodput          completed requests meeting every given SLO / duration; a TPOT SLO
//                            is met by requests with n <= 1.
//   prefix_cache_hit_ratio   sum(usage.cached_tokens) / sum(usage.prompt_tokens) over completed
//                            requests that reported usage.
//   short_outputs            completed requests that received fewer tokens than max_tokens (the
//                            context window, a stop token or ignore_eos off ended them early).
//   errors                   failed requests by gRPC status code name; requests the load test
//                            cancelled itself (Ctrl-C) are counted apart as `cancelled`.
// Pure computation; thread-compatible.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace pd::loadtest {

// What happened to one request. Times are nanoseconds from the start of the run (steady clock).
struct RequestRecord {
  int64_t index = 0;            // workload position
  int target = 0;               // 0 = --target, 1 = --compare_target (compare mode)
  int64_t source_line = 0;      // trace line; 0 otherwise
  int64_t scheduled_ns = 0;     // when the arrival process wanted it sent
  int64_t start_ns = 0;         // when it was sent
  int64_t first_token_ns = -1;  // first message with a token; -1 = none
  int64_t end_ns = 0;           // final status received
  int64_t input_tokens = 0;     // prompt tokens sent
  int64_t max_tokens = 0;       // requested output length
  int64_t output_tokens = 0;    // tokens received
  // Usage from the final message; has_usage false when none arrived.
  bool has_usage = false;
  int64_t prompt_tokens = 0;
  int64_t cached_tokens = 0;
  int64_t completion_tokens = 0;
  std::string finish_reason;  // "STOP", "LENGTH", ... ; "" = no final message
  absl::StatusCode code = absl::StatusCode::kOk;
  std::string error;                 // status message when code != OK
  bool cancelled_by_client = false;  // the load test cancelled it (Ctrl-C)
  std::vector<int64_t> itl_ns;       // ITL samples of this request (see the file comment)

  bool ok() const { return code == absl::StatusCode::kOk && !cancelled_by_client; }
  // Milliseconds; negative when undefined (no token, n <= 1).
  double TtftMs() const;
  double E2elMs() const;
  double TpotMs() const;
};

// SLOs for goodput; nullopt = not set. Milliseconds.
struct Slo {
  std::optional<double> ttft_ms;
  std::optional<double> tpot_ms;
  bool any() const { return ttft_ms.has_value() || tpot_ms.has_value(); }
};

// mean, median, p90, p95, p99 of a sample, in milliseconds; all 0 when count == 0.
struct LatencyStats {
  int64_t count = 0;
  double mean = 0;
  double median = 0;
  double p90 = 0;
  double p95 = 0;
  double p99 = 0;
};

struct Summary {
  int64_t num_requests = 0;  // records (sent requests that ended)
  int64_t completed = 0;
  int64_t failed = 0;
  int64_t cancelled = 0;  // cancelled by the load test itself
  double duration_s = 0;
  int64_t total_input_tokens = 0;     // of completed requests
  int64_t total_output_tokens = 0;    // of completed requests
  int64_t short_outputs = 0;          // completed with output_tokens < max_tokens
  double request_throughput = 0;      // req/s
  double output_throughput = 0;       // tok/s
  double total_token_throughput = 0;  // tok/s
  Slo slo;
  int64_t good_requests = 0;   // meaningful when slo.any()
  double request_goodput = 0;  // req/s; meaningful when slo.any()
  LatencyStats ttft, tpot, itl, e2el;
  std::map<std::string, int64_t> errors;  // status code name ("UNAVAILABLE") -> count
  int64_t usage_prompt_tokens = 0;
  int64_t usage_cached_tokens = 0;
  std::optional<double> prefix_cache_hit_ratio;  // nullopt when no usage was reported
};

// The p-th percentile (0 <= p <= 100) of an ascending sample, linearly interpolated between
// closest ranks (numpy.percentile's default). 0 for an empty sample.
double Percentile(const std::vector<double>& sorted, double p);

// Sorts `values` and computes its statistics.
LatencyStats ComputeStats(std::vector<double> values);

// True when a completed request meets `slo`.
bool MeetsSlo(const RequestRecord& r, const Slo& slo);

// Summarizes a run of `duration_ns` (first send -> last completion).
Summary Summarize(const std::vector<RequestRecord>& records, int64_t duration_ns, const Slo& slo);

// "OK", "UNAVAILABLE", ... (gRPC's spelling, which absl shares).
std::string StatusCodeName(absl::StatusCode code);

}  // namespace pd::loadtest
