#include "services/worker/convert.h"

#include <cmath>
#include <utility>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pd::worker {
namespace {

using ::testing::HasSubstr;

TEST(ConvertTest, SamplingDefaultsAndRanges) {
  pdserve::v1::SamplingParams p;
  absl::StatusOr<engine::SamplingOptions> s = SamplingFromProto(p);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->temperature, 0.0f);
  EXPECT_EQ(s->top_p, 1.0f);  // 0 = off
  p.set_temperature(-1);
  EXPECT_THAT(SamplingFromProto(p).status().message(), HasSubstr("temperature"));
  p.set_temperature(0.5);
  p.set_top_p(1.5);
  EXPECT_THAT(SamplingFromProto(p).status().message(), HasSubstr("top_p"));
  p.set_top_p(0.9f);
  p.set_max_tokens(2);
  p.set_min_tokens(3);
  EXPECT_THAT(SamplingFromProto(p).status().message(), HasSubstr("min_tokens"));
  p.set_min_tokens(1);
  p.set_seed(42);
  p.add_stop("x");
  p.add_stop_token_ids(7);
  s = SamplingFromProto(p);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->seed, 42u);
  EXPECT_EQ(s->stop.size(), 1u);
  EXPECT_EQ(s->stop_token_ids.size(), 1u);
  EXPECT_EQ(s->logprobs, -1);  // unset = not asked
  p.set_logprobs(0);
  EXPECT_EQ(SamplingFromProto(p)->logprobs, 0);
  p.set_logprobs(20);
  EXPECT_EQ(SamplingFromProto(p)->logprobs, 20);
  p.set_logprobs(21);
  EXPECT_THAT(SamplingFromProto(p).status().message(), HasSubstr("sampling.logprobs"));
}

TEST(ConvertTest, PenaltiesBiasAndMinP) {
  pdserve::v1::SamplingParams p;
  absl::StatusOr<engine::SamplingOptions> s = SamplingFromProto(p);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->repetition_penalty, 1.0f);  // 0 = unset = off
  EXPECT_EQ(s->presence_penalty, 0.0f);
  EXPECT_EQ(s->frequency_penalty, 0.0f);
  EXPECT_EQ(s->min_p, 0.0f);
  EXPECT_TRUE(s->logit_bias.empty());
  p.set_presence_penalty(-1.5f);
  p.set_frequency_penalty(2.0f);
  p.set_repetition_penalty(1.2f);
  p.set_min_p(0.1f);
  (*p.mutable_logit_bias())[300] = -100.0f;
  (*p.mutable_logit_bias())[7] = 2.5f;
  (*p.mutable_logit_bias())[42] = 100.0f;
  s = SamplingFromProto(p);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->presence_penalty, -1.5f);
  EXPECT_EQ(s->frequency_penalty, 2.0f);
  EXPECT_EQ(s->repetition_penalty, 1.2f);
  EXPECT_EQ(s->min_p, 0.1f);
  // Sorted by id whatever the map's order.
  EXPECT_EQ(s->logit_bias,
            (std::vector<std::pair<uint32_t, float>>{{7, 2.5f}, {42, 100.0f}, {300, -100.0f}}));
  auto refused = [&](auto set, const char* field) {
    pdserve::v1::SamplingParams bad = p;
    set(&bad);
    EXPECT_THAT(SamplingFromProto(bad).status().message(), HasSubstr(field));
  };
  refused([](auto* b) { b->set_presence_penalty(2.5f); }, "sampling.presence_penalty");
  refused([](auto* b) { b->set_frequency_penalty(-2.01f); }, "sampling.frequency_penalty");
  refused([](auto* b) { b->set_frequency_penalty(NAN); }, "sampling.frequency_penalty");
  refused([](auto* b) { b->set_repetition_penalty(-1.0f); }, "sampling.repetition_penalty");
  refused([](auto* b) { b->set_repetition_penalty(INFINITY); }, "sampling.repetition_penalty");
  refused([](auto* b) { b->set_min_p(1.5f); }, "sampling.min_p");
  refused([](auto* b) { (*b->mutable_logit_bias())[9] = 100.5f; }, "sampling.logit_bias[9]");
}

TEST(ConvertTest, TokenLogprobRoundTrips) {
  engine::TokenLogprob in;
  in.logprob = -0.25f;
  in.top = {{7, -0.25f}, {3, -2.5f}};
  pdserve::v1::TokenLogprob wire;
  TokenLogprobToProto(in, &wire);
  ASSERT_EQ(wire.top_size(), 2);
  EXPECT_EQ(wire.top(1).token_id(), 3u);
  const engine::TokenLogprob out = TokenLogprobFromProto(wire);
  EXPECT_EQ(out.logprob, in.logprob);
  EXPECT_EQ(out.top, in.top);
}

TEST(ConvertTest, FinishReasonsMap) {
  EXPECT_EQ(FinishReasonToProto(engine::FinishReason::kStopString),
            pdserve::v1::FINISH_REASON_STOP_STRING);
  EXPECT_EQ(FinishReasonToProto(engine::FinishReason::kNone),
            pdserve::v1::FINISH_REASON_UNSPECIFIED);
}

}  // namespace
}  // namespace pd::worker
