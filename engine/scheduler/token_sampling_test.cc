#include "engine/scheduler/token_sampling.h"

#include <cmath>
#include <limits>
#include <map>
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

TEST(TokenSamplingTest, SampleSpecCarriesMinP) {
  SamplingOptions so;
  so.temperature = 1.0f;
  so.min_p = 0.25f;
  EXPECT_EQ(SampleSpecFor(so, 0).min_p, 0.25f);
  EXPECT_TRUE(SampleSpecFor(so, 0).edits.empty());
}

// The edits as a map token -> edit (their order is free).
std::map<int32_t, kernels::LogitEdit> ById(absl::Span<const kernels::LogitEdit> edits) {
  std::map<int32_t, kernels::LogitEdit> out;
  for (const kernels::LogitEdit& e : edits) {
    EXPECT_TRUE(out.emplace(e.token, e).second) << "two edits of token " << e.token;
  }
  return out;
}

TEST(LogitEditBuilderTest, NoOptionsNoEdits) {
  SamplingOptions so;
  EXPECT_FALSE(HasLogitEdits(so));
  so.repetition_penalty = 1.0f;
  so.presence_penalty = 0.0f;
  EXPECT_FALSE(HasLogitEdits(so));
  LogitEditBuilder b;
  const std::vector<uint32_t> tokens = {1, 2, 3, 3};
  EXPECT_TRUE(b.Build(so, tokens, 2).empty());
  so.presence_penalty = 0.1f;
  EXPECT_TRUE(HasLogitEdits(so));
}

// Each source of edits on a prompt {1, 5, 5} and an output {5, 7, 7, 7}: the bias entries, the
// repetition penalty on prompt and output tokens, the frequency and presence penalties on the
// output's counts only (OpenAI counts generated tokens).
TEST(LogitEditBuilderTest, EditsFollowTheCounts) {
  SamplingOptions so;
  so.logit_bias = {{3, -100.0f}, {7, 2.0f}};
  so.repetition_penalty = 1.5f;
  so.frequency_penalty = 0.5f;
  so.presence_penalty = 0.25f;
  const std::vector<uint32_t> tokens = {1, 5, 5, 5, 7, 7, 7};
  LogitEditBuilder b;
  std::map<int32_t, kernels::LogitEdit> e = ById(b.Build(so, tokens, 3));
  ASSERT_EQ(e.size(), 4u);  // 1 (prompt), 3 (bias), 5 (both), 7 (bias + output)
  EXPECT_EQ(e[1].repetition, 1.5f);
  EXPECT_EQ(e[1].frequency, 0.0f);
  EXPECT_EQ(e[1].presence, 0.0f);  // prompt tokens take no presence penalty
  EXPECT_EQ(e[3].bias, -100.0f);
  EXPECT_EQ(e[3].repetition, 1.0f);  // neither in the prompt nor in the output
  EXPECT_EQ(e[5].repetition, 1.5f);
  EXPECT_EQ(e[5].frequency, 0.5f);  // once in the output
  EXPECT_EQ(e[5].presence, 0.25f);
  EXPECT_EQ(e[7].bias, 2.0f);
  EXPECT_EQ(e[7].frequency, 1.5f);  // three times
  EXPECT_EQ(e[7].presence, 0.25f);
  // Without a repetition penalty the prompt adds nothing.
  so.repetition_penalty = 1.0f;
  e = ById(LogitEditBuilder().Build(so, tokens, 3));
  EXPECT_EQ(e.size(), 3u);
  EXPECT_EQ(e.count(1), 0u);
  EXPECT_EQ(e[5].repetition, 1.0f);
}

// Built step by step (the scheduler's way) or from scratch (a resumed request, a prefill
// worker), the edits are the same; a token list that is not an extension is recounted.
TEST(LogitEditBuilderTest, IncrementalEqualsFromScratch) {
  SamplingOptions so;
  so.repetition_penalty = 1.2f;
  so.frequency_penalty = -0.7f;
  so.presence_penalty = 1.1f;
  so.logit_bias = {{9, 4.0f}};
  std::vector<uint32_t> tokens = {1, 9, 4};
  LogitEditBuilder step;
  for (uint32_t next : {4u, 8u, 8u, 9u, 2u, 4u, 4u, 11u}) {
    tokens.push_back(next);
    const auto a = ById(step.Build(so, tokens, 3));
    const auto b = ById(LogitEditBuilder().Build(so, tokens, 3));
    ASSERT_EQ(a.size(), b.size());
    for (const auto& [id, e] : b) {
      EXPECT_EQ(a.at(id).bias, e.bias);
      EXPECT_EQ(a.at(id).repetition, e.repetition);
      EXPECT_EQ(a.at(id).frequency, e.frequency) << id;
      EXPECT_EQ(a.at(id).presence, e.presence);
    }
  }
  // A different output of the same length (not an extension): counted afresh.
  std::vector<uint32_t> other = {1, 9, 4, 5, 5, 5, 5, 5, 5, 5, 5};
  ASSERT_EQ(other.size(), tokens.size());
  const auto e = ById(step.Build(so, other, 3));
  EXPECT_EQ(e.at(5).frequency, -0.7f * 8);
  EXPECT_EQ(e.count(8), 0u);
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
  EXPECT_TRUE(lp->all.empty());  // (only when asked)
}

TEST(TokenSamplingTest, TheWholeDistributionIsEveryTokensLogSoftmax) {
  const std::vector<float> logits = {0.0f, std::nanf(""), std::log(2.0f), 0.0f};
  absl::StatusOr<TokenLogprob> lp = ComputeLogprob(logits.data(), 4, 2, 1, true);
  ASSERT_TRUE(lp.ok()) << lp.status();
  ASSERT_EQ(lp->all.size(), 4u);
  // softmax over the finite logits = {1/4, 0, 1/2, 1/4}; the NaN one is -inf, as in the kernel.
  EXPECT_NEAR(lp->all[0], std::log(0.25), 1e-6);
  EXPECT_EQ(lp->all[1], -std::numeric_limits<float>::infinity());
  EXPECT_NEAR(lp->all[2], std::log(0.5), 1e-6);
  EXPECT_NEAR(lp->all[3], std::log(0.25), 1e-6);
  EXPECT_NEAR(lp->all[2], lp->logprob, 1e-6);
  EXPECT_NEAR(lp->all[2], lp->top[0].second, 1e-6);
}

}  // namespace
}  // namespace pd::engine
