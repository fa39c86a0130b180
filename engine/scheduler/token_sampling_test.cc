#include "engine/scheduler/token_sampling.h"

#include <cmath>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pd::engine {
namespace {

TEST(TokenSamplingTest, SampleSpecFollowsTheOptions) {
  SamplingOptions so;
  so.temperature = 0.7f;
  so.top_k = 5;
  so.top_p = 0.9f;
  so.seed = 42;
  SampleSpec sp = SampleSpecFor(so, 3);
  EXPECT_EQ(sp.temperature, 0.7f);
  EXPECT_EQ(sp.top_k, 5);
  EXPECT_EQ(sp.top_p, 0.9f);
  EXPECT_EQ(sp.seed, 42u);
  EXPECT_EQ(sp.step, 3u);
  EXPECT_FALSE(sp.want_logits);

  so.temperature = 1e-6f;  // below the threshold: greedy
  so.top_p = 0.0f;         // 0 means 1
  so.logprobs = 0;
  sp = SampleSpecFor(so, 0);
  EXPECT_EQ(sp.temperature, 0.0f);
  EXPECT_EQ(sp.top_p, 1.0f);
  EXPECT_TRUE(sp.want_logits);
}

TEST(TokenSamplingTest, LogprobIsLogSoftmaxWithTheTopAlternatives) {
  // softmax = {1/4, 1/4, 1/2}
  const std::vector<float> logits = {0.0f, 0.0f, std::log(2.0f)};
  absl::StatusOr<TokenLogprob> lp = ComputeLogprob(logits.data(), 3, 1, 2);
  ASSERT_TRUE(lp.ok()) << lp.status();
  EXPECT_NEAR(lp->logprob, std::log(0.25), 1e-6);
  ASSERT_EQ(lp->top.size(), 2u);
  EXPECT_EQ(lp->top[0].first, 2u);
  EXPECT_NEAR(lp->top[0].second, std::log(0.5), 1e-6);
  EXPECT_EQ(lp->top[1].first, 0u);  // ties by ascending id
  EXPECT_TRUE(ComputeLogprob(logits.data(), 3, 1, 0)->top.empty());
  EXPECT_TRUE(absl::IsInvalidArgument(ComputeLogprob(logits.data(), 3, 1, 21).status()));
}

}  // namespace
}  // namespace pd::engine
