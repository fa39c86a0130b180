#include "services/tierd/fetch_estimate.h"

#include "gtest/gtest.h"

namespace pd::tierd {
namespace {

constexpr double kBlock = 1 << 20;  // 1 MiB blocks

TEST(FetchEstimateTest, EmptyPredictsNothing) {
  FetchEstimate e;
  EXPECT_TRUE(e.empty());
  EXPECT_EQ(e.Predict(16 * kBlock, 1), 0);
  EXPECT_EQ(e.latency_seconds(), 0);
  EXPECT_EQ(e.seconds_per_byte(), 0);
}

TEST(FetchEstimateTest, SeparatesLatencyFromBandwidthWhenRequestSizesVary) {
  // A path with 2 ms per request and 1 GB/s: runs of 1..16 blocks.
  FetchEstimate e;
  for (int i = 0; i < 64; ++i) {
    const double bytes = (1 + i % 16) * kBlock;
    e.Add(bytes, 0.002 + bytes * 1e-9);
  }
  EXPECT_NEAR(e.latency_seconds(), 0.002, 1e-6);
  EXPECT_NEAR(e.seconds_per_byte(), 1e-9, 1e-12);
  // A one-block fetch is mostly latency; a 64-block one in 4 requests mostly bandwidth.
  EXPECT_NEAR(e.Predict(kBlock, 1), 0.002 + kBlock * 1e-9, 1e-6);
  EXPECT_NEAR(e.Predict(64 * kBlock, 4), 4 * 0.002 + 64 * kBlock * 1e-9, 1e-5);
}

TEST(FetchEstimateTest, EqualSizesFoldTheLatencyIntoTheTimePerByte) {
  FetchEstimate e;
  for (int i = 0; i < 10; ++i) e.Add(16 * kBlock, 0.018);
  EXPECT_EQ(e.latency_seconds(), 0);
  EXPECT_NEAR(e.Predict(16 * kBlock, 1), 0.018, 1e-9);
  EXPECT_NEAR(e.Predict(8 * kBlock, 1), 0.009, 1e-9);
}

TEST(FetchEstimateTest, FollowsAPathThatSlowsDown) {
  FetchEstimate e;
  for (int i = 0; i < 20; ++i) e.Add(16 * kBlock, 0.016);
  for (int i = 0; i < 20; ++i) e.Add(16 * kBlock, 0.160);
  // After 20 samples at weight 0.2 the old speed counts (0.8^20) ~1%.
  EXPECT_NEAR(e.Predict(16 * kBlock, 1), 0.160, 0.003);
}

TEST(FetchEstimateTest, ImplausibleFitsAndBadSamplesFallBack) {
  FetchEstimate e;
  e.Add(0, 1);        // no bytes: ignored
  e.Add(kBlock, -1);  // negative time: ignored
  EXPECT_TRUE(e.empty());
  // Bigger requests that took less time (noise): no negative slope, the average instead.
  e.Add(kBlock, 0.010);
  e.Add(8 * kBlock, 0.004);
  EXPECT_EQ(e.latency_seconds(), 0);
  EXPECT_GT(e.seconds_per_byte(), 0);
  EXPECT_GT(e.Predict(4 * kBlock, 1), 0);
}

}  // namespace
}  // namespace pd::tierd
