#include "services/worker/convert.h"

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
