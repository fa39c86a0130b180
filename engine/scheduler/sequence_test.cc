#include "engine/scheduler/sequence.h"

#include <memory>
#include <string>
#include <vector>

#include "common/log/log.h"
#include "engine/model/llama2c_tokenizer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pd::engine::scheduler_internal {
namespace {

using ::testing::ElementsAre;

constexpr char kTokenizer[] = PD_SHARED_DIR "/models/stories260K/tok512.bin";

class SequenceTest : public ::testing::Test {
 protected:
  SequenceTest() {
    absl::StatusOr<Llama2cTokenizer> tok = Llama2cTokenizer::Load(kTokenizer, 512);
    CHECK(tok.ok()) << tok.status();
    tokenizer_ = std::make_unique<Llama2cTokenizer>(*std::move(tok));
    seq_.request.id = RequestId(3);
    seq_.tokens = {1, 2, 3};
    seq_.prompt_len = 3;
    seq_.detok = std::make_unique<DecodeStream>(tokenizer_.get(), 3);
  }

  std::unique_ptr<Llama2cTokenizer> tokenizer_;
  Sequence seq_;
};

TEST_F(SequenceTest, StopTokensAreEosUnlessIgnoredAndTheRequestsIds) {
  const std::vector<uint32_t> eos = {2};
  seq_.request.sampling.stop_token_ids = {9};
  EXPECT_TRUE(seq_.IsStopToken(2, eos));
  EXPECT_TRUE(seq_.IsStopToken(9, eos));
  EXPECT_FALSE(seq_.IsStopToken(5, eos));
  seq_.request.sampling.ignore_eos = true;
  EXPECT_FALSE(seq_.IsStopToken(2, eos));
  EXPECT_TRUE(seq_.IsStopToken(9, eos));
}

TEST_F(SequenceTest, StopStringsCutTheTextAndHoldBackAPossibleStart) {
  seq_.request.sampling.stop = {"world", "xyz"};
  seq_.text = "Hello wor";
  size_t hold = 0;
  EXPECT_FALSE(seq_.CutAtStopString(&hold));
  EXPECT_EQ(hold, 3u);  // "wor" may grow into "world"
  seq_.text += "ld!";
  hold = 0;
  EXPECT_TRUE(seq_.CutAtStopString(&hold));
  EXPECT_EQ(seq_.text, "Hello ");

  // Text already sent stays sent (min_tokens delayed the check).
  seq_.text = "abcxyzd";
  seq_.text_sent = 5;
  hold = 0;
  EXPECT_TRUE(seq_.CutAtStopString(&hold));
  EXPECT_EQ(seq_.text, "abcxy");
}

TEST_F(SequenceTest, StreamOutputsSendWhatIsNotHeldBack) {
  seq_.AppendToken(7, std::nullopt);
  seq_.AppendToken(8, TokenLogprob{-1.0f, {}});
  EXPECT_THAT(seq_.tokens, ElementsAre(1, 2, 3, 7, 8));
  EXPECT_EQ(seq_.num_generated(), 2u);
  seq_.text = "Hello wor";
  GenerationOutput out = seq_.TakeStreamOutput(3);
  EXPECT_EQ(out.id, RequestId(3));
  EXPECT_THAT(out.new_tokens, ElementsAre(7, 8));
  ASSERT_EQ(out.logprobs.size(), 1u);
  EXPECT_EQ(out.text, "Hello ");
  EXPECT_EQ(out.finish_reason, FinishReason::kNone);
  out = seq_.TakeStreamOutput(0);
  EXPECT_TRUE(out.new_tokens.empty());
  EXPECT_EQ(out.text, "wor");
}

TEST_F(SequenceTest, FinalOutputCarriesTheRestTheCountsAndTheTimings) {
  seq_.AppendToken(7, std::nullopt);
  seq_.text = "Hi there";
  seq_.text_sent = 3;
  seq_.finished = FinishReason::kLength;
  seq_.admitted_once = true;
  seq_.cached_tokens = 16;
  seq_.restored_tokens = 32;  // never reported above cached_tokens
  seq_.num_preemptions = 2;
  seq_.submitted = absl::FromUnixSeconds(100);
  seq_.first_scheduled = absl::FromUnixSeconds(103);
  seq_.prefill_done = absl::FromUnixSeconds(110);
  seq_.first_token = absl::FromUnixSeconds(111);
  GenerationOutput out = seq_.TakeFinalOutput(absl::FromUnixSeconds(120));
  EXPECT_THAT(out.new_tokens, ElementsAre(7));
  EXPECT_EQ(out.text, "there");
  EXPECT_EQ(out.finish_reason, FinishReason::kLength);
  EXPECT_EQ(out.prompt_tokens, 3u);
  EXPECT_EQ(out.completion_tokens, 1u);
  EXPECT_EQ(out.cached_tokens, 16u);
  EXPECT_EQ(out.restored_tokens, 16u);
  EXPECT_EQ(out.num_preemptions, 2u);
  EXPECT_EQ(out.timings.queue, absl::Seconds(3));
  EXPECT_EQ(out.timings.prefill, absl::Seconds(7));
  EXPECT_EQ(out.timings.first_token, absl::Seconds(11));
  EXPECT_EQ(out.timings.total, absl::Seconds(20));
}

TEST_F(SequenceTest, FinalOutputOfARequestThatNeverRan) {
  seq_.finished = FinishReason::kAbort;
  seq_.status = absl::CancelledError("request cancelled");
  seq_.submitted = absl::FromUnixSeconds(100);
  GenerationOutput out = seq_.TakeFinalOutput(absl::FromUnixSeconds(104));
  EXPECT_TRUE(absl::IsCancelled(out.status));
  EXPECT_EQ(out.timings.queue, absl::Seconds(4));  // queued until it ended
  EXPECT_EQ(out.timings.prefill, absl::ZeroDuration());
  EXPECT_EQ(out.timings.first_token, absl::ZeroDuration());
  EXPECT_EQ(out.completion_tokens, 0u);
}

}  // namespace
}  // namespace pd::engine::scheduler_internal
