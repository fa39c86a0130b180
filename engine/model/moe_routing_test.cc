#include "engine/model/moe_routing.h"

#include <cmath>
#include <vector>

#include "gtest/gtest.h"

namespace pd::engine {
namespace {

TEST(MoeRoutingTest, TopKOfTheSoftmaxRenormalizedOrNot) {
  // Two tokens, four experts. Token 0 prefers experts 2 then 0; token 1 experts 1 then 3.
  const std::vector<float> logits = {1.0f, -1.0f, 2.0f, 0.0f,   //
                                     0.0f, 3.0f, -2.0f, 1.0f};
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

}  // namespace
}  // namespace pd::engine
