#include "loadtest/metrics.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace pd::loadtest {

double RequestRecord::TtftMs() const {
  return first_token_ns < 0 ? -1 : static_cast<double>(first_token_ns - start_ns) / 1e6;
}

double RequestRecord::E2elMs() const { return static_cast<double>(end_ns - start_ns) / 1e6; }

double RequestRecord::TpotMs() const {
  if (first_token_ns < 0 || output_tokens <= 1) {
    return -1;
  }
  return static_cast<double>(end_ns - first_token_ns) / 1e6 /
         static_cast<double>(output_tokens - 1);
}

double Percentile(const std::vector<double>& sorted, double p) {
  if (sorted.empty()) {
    return 0;
  }
  const double rank = p / 100.0 * static_cast<double>(sorted.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(rank));
  const size_t hi = std::min(lo + 1, sorted.size() - 1);
  const double frac = rank - static_cast<double>(lo);
  return sorted[lo] + (sorted[hi] - sorted[lo]) * frac;
}

LatencyStats ComputeStats(std::vector<double> values) {
  LatencyStats s;
  s.count = static_cast<int64_t>(values.size());
  if (values.empty()) {
    return s;
  }
  std::sort(values.begin(), values.end());
  s.mean = std::accumulate(values.begin(), values.end(), 0.0) / static_cast<double>(values.size());
  s.median = Percentile(values, 50);
  s.p90 = Percentile(values, 90);
  s.p95 = Percentile(values, 95);
  s.p99 = Percentile(values, 99);
  return s;
}

bool MeetsSlo(const RequestRecord& r, const Slo& slo) {
  if (!r.ok()) {
    return false;
  }
  if (slo.ttft_ms.has_value() && !(r.TtftMs() >= 0 && r.TtftMs() <= *slo.ttft_ms)) {
    return false;
  }
  if (slo.tpot_ms.has_value() && r.output_tokens > 1 && r.TpotMs() > *slo.tpot_ms) {
    return false;
  }
  return true;
}

Summary Summarize(const std::vector<RequestRecord>& records, int64_t duration_ns, const Slo& slo) {
  Summary s;
  s.slo = slo;
  s.num_requests = static_cast<int64_t>(records.size());
  s.duration_s = static_cast<double>(duration_ns) / 1e9;
  std::vector<double> ttft, tpot, itl, e2el;
  for (const RequestRecord& r : records) {
    if (r.cancelled_by_client) {
      ++s.cancelled;
      continue;
    }
    if (!r.ok()) {
      ++s.failed;
      ++s.errors[StatusCodeName(r.code)];
      continue;
    }
    ++s.completed;
    s.total_input_tokens += r.input_tokens;
    s.total_output_tokens += r.output_tokens;
    if (r.output_tokens < r.max_tokens) {
      ++s.short_outputs;
    }
    if (r.first_token_ns >= 0) {
      ttft.push_back(r.TtftMs());
    }
    if (r.TpotMs() >= 0) {
      tpot.push_back(r.TpotMs());
    }
    e2el.push_back(r.E2elMs());
    for (int64_t gap : r.itl_ns) {
      itl.push_back(static_cast<double>(gap) / 1e6);
    }
    if (r.has_usage) {
      s.usage_prompt_tokens += r.prompt_tokens;
      s.usage_cached_tokens += r.cached_tokens;
    }
    if (slo.any() && MeetsSlo(r, slo)) {
      ++s.good_requests;
    }
  }
  if (s.duration_s > 0) {
    s.request_throughput = static_cast<double>(s.completed) / s.duration_s;
    s.output_throughput = static_cast<double>(s.total_output_tokens) / s.duration_s;
    s.total_token_throughput =
        static_cast<double>(s.total_input_tokens + s.total_output_tokens) / s.duration_s;
    s.request_goodput = static_cast<double>(s.good_requests) / s.duration_s;
  }
  if (s.usage_prompt_tokens > 0) {
    s.prefix_cache_hit_ratio =
        static_cast<double>(s.usage_cached_tokens) / static_cast<double>(s.usage_prompt_tokens);
  }
  s.ttft = ComputeStats(std::move(ttft));
  s.tpot = ComputeStats(std::move(tpot));
  s.itl = ComputeStats(std::move(itl));
  s.e2el = ComputeStats(std::move(e2el));
  return s;
}

std::string StatusCodeName(absl::StatusCode code) {
  // absl spells codes as gRPC does ("UNAVAILABLE", "INVALID_ARGUMENT"); codes map 1:1.
  return absl::StatusCodeToString(code);
}

}  // namespace pd::loadtest
