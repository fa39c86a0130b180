#include "loadtest/arrival.h"

#include <cmath>
#include <vector>

#include "gtest/gtest.h"

namespace pd::loadtest {
namespace {

struct Moments {
  double mean_s;
  double cv;  // coefficient of variation
};

Moments Measure(ArrivalGaps& g, int n) {
  std::vector<double> gaps;
  double sum = 0;
  for (int i = 0; i < n; ++i) {
    gaps.push_back(absl::ToDoubleSeconds(g.Next()));
    sum += gaps.back();
  }
  const double mean = sum / n;
  double var = 0;
  for (double x : gaps) {
    var += (x - mean) * (x - mean);
  }
  return {mean, std::sqrt(var / (n - 1)) / mean};
}

// With n = 100,000 exponential gaps the standard error of the mean is 1/sqrt(n) = 0.3% of the
// mean: 2% is a > 6-sigma band, and the fixed seed makes the test deterministic anyway.
TEST(ArrivalTest, PoissonMeanRateWithinTolerance) {
  absl::StatusOr<ArrivalGaps> g = ArrivalGaps::Create(/*rate_per_s=*/250, 1.0, /*seed=*/1);
  ASSERT_TRUE(g.ok()) << g.status();
  const Moments m = Measure(*g, 100'000);
  EXPECT_NEAR(1.0 / m.mean_s, 250, 250 * 0.02);
  EXPECT_NEAR(m.cv, 1.0, 0.03);  // exponential: CV 1
}

TEST(ArrivalTest, GammaKeepsTheRateAndSetsBurstiness) {
  for (double burstiness : {0.25, 4.0}) {
    absl::StatusOr<ArrivalGaps> g = ArrivalGaps::Create(100, burstiness, 7);
    ASSERT_TRUE(g.ok()) << g.status();
    const Moments m = Measure(*g, 100'000);
    EXPECT_NEAR(1.0 / m.mean_s, 100, 100 * 0.03) << burstiness;
    EXPECT_NEAR(m.cv, 1.0 / std::sqrt(burstiness), 0.05) << burstiness;  // Gamma: 1/sqrt(k)
  }
}

TEST(ArrivalTest, SameSeedSameGaps) {
  ArrivalGaps a = *ArrivalGaps::Create(10, 1, 3);
  ArrivalGaps b = *ArrivalGaps::Create(10, 1, 3);
  ArrivalGaps c = *ArrivalGaps::Create(10, 1, 4);
  bool differs = false;
  for (int i = 0; i < 100; ++i) {
    const absl::Duration x = a.Next();
    EXPECT_EQ(x, b.Next());
    differs = differs || x != c.Next();
  }
  EXPECT_TRUE(differs);
}

TEST(ArrivalTest, RejectsBadParameters) {
  EXPECT_FALSE(ArrivalGaps::Create(0, 1, 0).ok());
  EXPECT_FALSE(ArrivalGaps::Create(-1, 1, 0).ok());
  EXPECT_FALSE(ArrivalGaps::Create(INFINITY, 1, 0).ok());
  EXPECT_FALSE(ArrivalGaps::Create(1, 0, 0).ok());
}

TEST(ArrivalTest, ModeNamesRoundTrip) {
  for (ArrivalMode m :
       {ArrivalMode::kClosed, ArrivalMode::kPoisson, ArrivalMode::kGamma, ArrivalMode::kTrace}) {
    absl::StatusOr<ArrivalMode> parsed = ParseArrivalMode(ArrivalModeName(m));
    ASSERT_TRUE(parsed.ok());
    EXPECT_EQ(*parsed, m);
  }
  EXPECT_FALSE(ParseArrivalMode("open").ok());
}

}  // namespace
}  // namespace pd::loadtest
