#include "loadtest/metrics.h"

#include "gtest/gtest.h"

namespace pd::loadtest {
namespace {

constexpr int64_t kMs = 1'000'000;

RequestRecord Ok(int64_t start_ms, int64_t first_ms, int64_t end_ms, int64_t n,
                 std::vector<int64_t> itl_ms) {
  RequestRecord r;
  r.start_ns = start_ms * kMs;
  r.first_token_ns = first_ms * kMs;
  r.end_ns = end_ms * kMs;
  r.input_tokens = 100;
  r.output_tokens = n;
  r.max_tokens = n;
  for (int64_t g : itl_ms) {
    r.itl_ns.push_back(g * kMs);
  }
  r.finish_reason = "LENGTH";
  return r;
}

RequestRecord Failed(absl::StatusCode code) {
  RequestRecord r;
  r.code = code;
  r.end_ns = 5 * kMs;
  return r;
}

// A small fixed set, every figure computed by hand (see the comments).
std::vector<RequestRecord> Records() {
  std::vector<RequestRecord> rs;
  rs.push_back(Ok(0, 10, 50, 5, {10, 10, 10, 10}));  // TTFT 10, TPOT 40/4 = 10, E2EL 50
  rs.push_back(Ok(0, 20, 120, 3, {50, 50}));         // TTFT 20, TPOT 100/2 = 50, E2EL 120
  rs.push_back(Ok(10, 40, 40, 1, {}));               // TTFT 30, no TPOT, E2EL 30
  rs[1].max_tokens = 8;                              // asked for 8, got 3: a short output
  rs[0].has_usage = true;
  rs[0].prompt_tokens = 100;
  rs[0].cached_tokens = 64;
  rs[1].has_usage = true;
  rs[1].prompt_tokens = 100;
  rs.push_back(Failed(absl::StatusCode::kUnavailable));
  rs.push_back(Failed(absl::StatusCode::kUnavailable));
  rs.push_back(Failed(absl::StatusCode::kResourceExhausted));
  RequestRecord cancelled = Failed(absl::StatusCode::kCancelled);
  cancelled.cancelled_by_client = true;
  rs.push_back(cancelled);
  return rs;
}

TEST(LoadMetricsTest, PercentileInterpolatesLikeNumpy) {
  const std::vector<double> v = {1, 2, 3, 4};
  EXPECT_DOUBLE_EQ(Percentile(v, 0), 1);
  EXPECT_DOUBLE_EQ(Percentile(v, 50), 2.5);
  EXPECT_DOUBLE_EQ(Percentile(v, 90), 3.7);  // rank 2.7
  EXPECT_DOUBLE_EQ(Percentile(v, 100), 4);
  EXPECT_DOUBLE_EQ(Percentile({7}, 99), 7);
  EXPECT_DOUBLE_EQ(Percentile({}, 50), 0);
}

TEST(LoadMetricsTest, PerRequestDefinitions) {
  const std::vector<RequestRecord> rs = Records();
  EXPECT_DOUBLE_EQ(rs[0].TtftMs(), 10);
  EXPECT_DOUBLE_EQ(rs[0].TpotMs(), 10);
  EXPECT_DOUBLE_EQ(rs[0].E2elMs(), 50);
  EXPECT_DOUBLE_EQ(rs[1].TpotMs(), 50);
  EXPECT_LT(rs[2].TpotMs(), 0);  // n = 1: undefined
  EXPECT_DOUBLE_EQ(rs[2].TtftMs(), 30);
}

TEST(LoadMetricsTest, SummaryOfAFixedSet) {
  const Summary s = Summarize(Records(), /*duration_ns=*/1000 * kMs, Slo{});
  EXPECT_EQ(s.num_requests, 7);
  EXPECT_EQ(s.completed, 3);
  EXPECT_EQ(s.failed, 3);
  EXPECT_EQ(s.cancelled, 1);
  EXPECT_DOUBLE_EQ(s.duration_s, 1.0);
  EXPECT_EQ(s.total_input_tokens, 300);
  EXPECT_EQ(s.total_output_tokens, 9);
  EXPECT_EQ(s.short_outputs, 1);
  EXPECT_DOUBLE_EQ(s.request_throughput, 3);
  EXPECT_DOUBLE_EQ(s.output_throughput, 9);
  EXPECT_DOUBLE_EQ(s.total_token_throughput, 309);

  // TTFT {10, 20, 30}: p90 at rank 1.8 = 28, p95 = 29, p99 = 29.8.
  EXPECT_EQ(s.ttft.count, 3);
  EXPECT_DOUBLE_EQ(s.ttft.mean, 20);
  EXPECT_DOUBLE_EQ(s.ttft.median, 20);
  EXPECT_DOUBLE_EQ(s.ttft.p90, 28);
  EXPECT_DOUBLE_EQ(s.ttft.p95, 29);
  EXPECT_DOUBLE_EQ(s.ttft.p99, 29.8);
  // TPOT {10, 50}: requests with n > 1 only.
  EXPECT_EQ(s.tpot.count, 2);
  EXPECT_DOUBLE_EQ(s.tpot.mean, 30);
  EXPECT_DOUBLE_EQ(s.tpot.median, 30);
  EXPECT_DOUBLE_EQ(s.tpot.p90, 46);
  EXPECT_DOUBLE_EQ(s.tpot.p99, 49.6);
  // ITL pooled {10, 10, 10, 10, 50, 50}.
  EXPECT_EQ(s.itl.count, 6);
  EXPECT_DOUBLE_EQ(s.itl.mean, 140.0 / 6);
  EXPECT_DOUBLE_EQ(s.itl.median, 10);
  EXPECT_DOUBLE_EQ(s.itl.p90, 50);
  // E2EL {30, 50, 120}: p90 at rank 1.8 = 50 + 0.8 * 70 = 106.
  EXPECT_DOUBLE_EQ(s.e2el.mean, 200.0 / 3);
  EXPECT_DOUBLE_EQ(s.e2el.median, 50);
  EXPECT_DOUBLE_EQ(s.e2el.p90, 106);

  EXPECT_EQ(s.errors.size(), 2u);
  EXPECT_EQ(s.errors.at("UNAVAILABLE"), 2);
  EXPECT_EQ(s.errors.at("RESOURCE_EXHAUSTED"), 1);
  // 64 cached of 200 reported prompt tokens (the third request reported no usage).
  ASSERT_TRUE(s.prefix_cache_hit_ratio.has_value());
  EXPECT_DOUBLE_EQ(*s.prefix_cache_hit_ratio, 0.32);
  EXPECT_EQ(s.good_requests, 0);  // no SLO given
}

TEST(LoadMetricsTest, GoodputUnderSlos) {
  Slo both;
  both.ttft_ms = 25;
  both.tpot_ms = 20;
  // Request 0 (10, 10) meets both; 1 misses TPOT (50); 2 misses TTFT (30).
  Summary s = Summarize(Records(), 1000 * kMs, both);
  EXPECT_EQ(s.good_requests, 1);
  EXPECT_DOUBLE_EQ(s.request_goodput, 1);

  Slo tpot_only;
  tpot_only.tpot_ms = 20;
  // Request 2 has a single token: it meets any TPOT SLO.
  s = Summarize(Records(), 500 * kMs, tpot_only);
  EXPECT_EQ(s.good_requests, 2);
  EXPECT_DOUBLE_EQ(s.request_goodput, 4);

  Slo ttft_only;
  ttft_only.ttft_ms = 20;  // inclusive bound
  EXPECT_EQ(Summarize(Records(), 1000 * kMs, ttft_only).good_requests, 2);
}

TEST(LoadMetricsTest, EmptyRunAndNoUsage) {
  const Summary s = Summarize({}, 0, Slo{});
  EXPECT_EQ(s.completed, 0);
  EXPECT_DOUBLE_EQ(s.request_throughput, 0);
  EXPECT_EQ(s.ttft.count, 0);
  EXPECT_FALSE(s.prefix_cache_hit_ratio.has_value());
}

TEST(LoadMetricsTest, StatusCodeNamesAreGrpcSpellings) {
  EXPECT_EQ(StatusCodeName(absl::StatusCode::kUnavailable), "UNAVAILABLE");
  EXPECT_EQ(StatusCodeName(absl::StatusCode::kResourceExhausted), "RESOURCE_EXHAUSTED");
  EXPECT_EQ(StatusCodeName(absl::StatusCode::kDeadlineExceeded), "DEADLINE_EXCEEDED");
}

}  // namespace
}  // namespace pd::loadtest
