#include "engine/model/moe_routing.h"

#include <cmath>
#include <vector>

#include "gtest/gtest.h"

namespace pd::engine {
namespace {

TEST(MoeRoutingTest, TopKOfTheSoftmaxRenormalizedOrNot) {
  // Two tokens, four experts. Token 0 prefers experts 2 then 0; token 1 experts 1 then 3.
  const std::vector<float> logits = {1.0f, -1.0f, 2.0f,  0.0f,  //
                                     0.0f, 3.0f,  -2.0f, 1.0f};
  MoeRouting r;
  RouteTokens(logits.data(), 2, 4, 2, /*normalize=*/false, &r);
  ASSERT_EQ(r.tokens.size(), 4u);
  EXPECT_EQ(r.tokens[0], std::vector<int32_t>({0}));
  EXPECT_EQ(r.tokens[1], std::vector<int32_t>({1}));
  EXPECT_EQ(r.tokens[2], std::vector<int32_t>({0}));
  EXPECT_EQ(r.tokens[3], std::vector<int32_t>({1}));
  const double z0 = std::exp(1.0) + std::exp(-1.0) + std::exp(2.0) + std::exp(0.0);
  EXPECT_NEAR(r.weights[2][0], std::exp(2.0) / z0, 1e-6);
  EXPECT_NEAR(r.weights[0][0], std::exp(1.0) / z0, 1e-6);
  RouteTokens(logits.data(), 2, 4, 2, /*normalize=*/true, &r);
  EXPECT_NEAR(r.weights[2][0], std::exp(2.0) / (std::exp(2.0) + std::exp(1.0)), 1e-6);
  EXPECT_NEAR(r.weights[2][0] + r.weights[0][0], 1.0, 1e-6);
  EXPECT_EQ(r.assignments(1), 1);
}

TEST(MoeRoutingTest, TiesGoToTheLowerExpertAndCallsReuseTheResult) {
  const std::vector<float> logits = {0.5f, 0.5f, 0.5f};
  MoeRouting r;
  RouteTokens(logits.data(), 1, 3, 1, true, &r);
  EXPECT_EQ(r.tokens[0], std::vector<int32_t>({0}));
  EXPECT_TRUE(r.tokens[1].empty());
  EXPECT_FLOAT_EQ(r.weights[0][0], 1.0f);
  // A second call starts from nothing: last call's assignments are gone.
  const std::vector<float> other = {0.0f, 1.0f, 0.0f, 0.0f, 1.0f, 0.0f};
  RouteTokens(other.data(), 2, 3, 1, true, &r);
  EXPECT_TRUE(r.tokens[0].empty());
  EXPECT_EQ(r.tokens[1], std::vector<int32_t>({0, 1}));
}

// DeepSeek-V2's group-limited greedy: 4 groups of 2; each group scored by its best expert, the
// token keeps the 2 best groups, then the top 2 experts inside them.
TEST(MoeRoutingTest, GroupLimitedGreedyPicksInsideTheBestGroups) {
  // Experts 0..7; the best two experts overall (6: 3.0, 7: 2.9) are in group 3, the next best
  // group by its maximum is group 0 (expert 1: 2.8); expert 4 (2.7) is in group 2, excluded.
  const std::vector<float> logits = {0.0f, 2.8f, 0.1f, 0.2f, 2.7f, 0.3f, 3.0f, 2.9f};
  MoeRule rule;
  rule.topk = MoeTopk::kGroupLimited;
  rule.n_group = 4;
  rule.topk_group = 1;  // group 3 only
  MoeRouting r;
  RouteTokens(logits.data(), 1, 8, 2, rule, &r);
  EXPECT_EQ(r.assignments(6), 1);
  EXPECT_EQ(r.assignments(7), 1);
  rule.topk_group = 2;  // groups 3 and 0: the top 3 are 6, 7 and 1 (not 4)
  RouteTokens(logits.data(), 1, 8, 3, rule, &r);
  EXPECT_EQ(r.assignments(1), 1);
  EXPECT_EQ(r.assignments(4), 0);
  // Unnormalized weights are the softmax probabilities times the scale.
  rule.scale = 2.0f;
  RouteTokens(logits.data(), 1, 8, 3, rule, &r);
  double z = 0;
  for (float l : logits) z += std::exp(static_cast<double>(l));
  EXPECT_NEAR(r.weights[6][0], 2.0 * std::exp(3.0) / z, 1e-6);
}

// DeepSeek-V3's noaux_tc: sigmoid scores, a selection bias that changes which experts are
// chosen but not their weights, groups ranked by the sum of their best two, renormalized then
// scaled.
TEST(MoeRoutingTest, SigmoidWithSelectionBiasWeighsWithTheUnbiasedScores) {
  const std::vector<float> logits = {1.0f, 0.0f, 0.6f, 0.5f};
  const std::vector<float> bias = {0.0f, 0.9f, 0.0f, 0.0f};
  MoeRule rule;
  rule.scoring = MoeScoring::kSigmoid;
  rule.topk = MoeTopk::kNoAuxTc;
  rule.n_group = 2;
  rule.topk_group = 1;
  rule.normalize = true;
  rule.scale = 2.5f;
  rule.selection_bias = bias.data();
  MoeRouting r;
  RouteTokens(logits.data(), 1, 4, 2, rule, &r);
  // Biased: group 0 = {0.73, 0.5 + 0.9} sums 2.13 > group 1's 0.65 + 0.62: experts 0 and 1.
  ASSERT_EQ(r.assignments(0), 1);
  ASSERT_EQ(r.assignments(1), 1);
  const double s0 = 1 / (1 + std::exp(-1.0)), s1 = 0.5;
  EXPECT_NEAR(r.weights[0][0], 2.5 * s0 / (s0 + s1), 1e-6);
  EXPECT_NEAR(r.weights[1][0], 2.5 * s1 / (s0 + s1), 1e-6);
  // Without the bias, group 1 (0.65 + 0.62) beats group 0 (0.73 + 0.5).
  rule.selection_bias = nullptr;
  RouteTokens(logits.data(), 1, 4, 2, rule, &r);
  EXPECT_EQ(r.assignments(2), 1);
  EXPECT_EQ(r.assignments(3), 1);
}

}  // namespace
}  // namespace pd::engine
