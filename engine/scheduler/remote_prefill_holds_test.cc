#include "engine/scheduler/remote_prefill_holds.h"

#include <memory>
#include <optional>
#include <vector>

#include "common/log/log.h"
#include "engine/scheduler/sequence.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pd::engine {
namespace {

using scheduler_internal::Sequence;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;

constexpr int64_t kBlockSize = 4;
constexpr int64_t kVocab = 32;

// A KV cache, the hand-offs over it, and one 10-token request (2 full blocks + 2 tokens).
class RemotePrefillHoldsTest : public ::testing::Test {
 protected:
  RemotePrefillHoldsTest() {
    absl::StatusOr<std::unique_ptr<kvcache::KvCacheManager>> kv =
        kvcache::KvCacheManager::Create({16, kBlockSize});
    CHECK(kv.ok()) << kv.status();
    kv_ = *std::move(kv);
    holds_ = std::make_unique<RemotePrefillHolds>(kv_.get(), kVocab);
    absl::StatusOr<BlockHash> seed = ComputeHashSeed({"model", "f32", kBlockSize, ""});
    CHECK(seed.ok()) << seed.status();
    seq_ = std::make_unique<Sequence>();
    seq_->request.id = RequestId(7);
    seq_->request.prompt = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
    seq_->tokens = seq_->request.prompt;
    seq_->prompt_len = seq_->tokens.size();
    seq_->kv_id = kvcache::SequenceId(1);
    seq_->seed = *seed;
    chain_ = ComputeBlockHashes(*seed, seq_->tokens, kBlockSize);
  }

  // Decode side: imports the prompt's blocks and starts the remote prefill (the hook records
  // what it was given).
  void StartRemote(int32_t logprobs = -1) {
    seq_->request.sampling.logprobs = logprobs;
    seq_->request.remote_prefill = [this](RemotePrefillTarget t) { targets_.push_back(t); };
    absl::StatusOr<kvcache::ImportTarget> import =
        kv_->ImportBlocks(seq_->kv_id, chain_, static_cast<int64_t>(seq_->tokens.size()));
    ASSERT_TRUE(import.ok()) << import.status();
    holds_->Start(seq_.get(), *std::move(import), chain_);
  }

  std::unique_ptr<kvcache::KvCacheManager> kv_;
  std::unique_ptr<RemotePrefillHolds> holds_;
  std::unique_ptr<Sequence> seq_;
  std::vector<BlockHash> chain_;
  std::vector<RemotePrefillTarget> targets_;
};

TEST_F(RemotePrefillHoldsTest, StartHandsTheImportedBlocksToTheHook) {
  StartRemote();
  ASSERT_EQ(targets_.size(), 1u);
  const RemotePrefillTarget& t = targets_[0];
  EXPECT_EQ(t.id, RequestId(7));
  EXPECT_EQ(t.num_cached_tokens, 0);
  EXPECT_EQ(t.first_block, 0);
  EXPECT_THAT(t.block_ids, ElementsAreArray(kv_->GetTable(seq_->kv_id)->blocks()));
  EXPECT_EQ(t.block_ids.size(), 3u);  // incl. the partial last block
  EXPECT_EQ(t.chain, chain_);
  EXPECT_TRUE(seq_->remote_started);
  EXPECT_TRUE(seq_->remote_pending);
}

TEST_F(RemotePrefillHoldsTest, CompleteCommitsThePromptAndDropsAnEntryNotAskedFor) {
  StartRemote();
  std::optional<TokenLogprob> lp = TokenLogprob{-0.5f, {}};
  ASSERT_TRUE(holds_->Complete(RequestId(7), seq_.get(), 5, &lp).ok());
  EXPECT_FALSE(lp.has_value());
  EXPECT_FALSE(seq_->remote_pending);
  EXPECT_TRUE(seq_->prefilled_remotely);
  EXPECT_EQ(seq_->num_computed, 10);
  EXPECT_EQ(seq_->chain, chain_);
  EXPECT_EQ(kv_->Match(chain_), 2);  // the full blocks are prefix-cache hits now
  EXPECT_EQ(holds_->num_failures(), 0);
}

TEST_F(RemotePrefillHoldsTest, CompleteKeepsAUsableEntryWhenAsked) {
  StartRemote(/*logprobs=*/2);
  std::optional<TokenLogprob> lp = TokenLogprob{-0.5f, {{5, -0.5f}, {6, -1.5f}}};
  ASSERT_TRUE(holds_->Complete(RequestId(7), seq_.get(), 5, &lp).ok());
  ASSERT_TRUE(lp.has_value());
  EXPECT_EQ(lp->top.size(), 2u);
}

TEST_F(RemotePrefillHoldsTest, UnusableAnswersFallBackToLocalPrefill) {
  struct Case {
    uint32_t token;
    int32_t asked;
    std::optional<TokenLogprob> lp;
    const char* message;
  };
  const std::vector<Case> cases = {
      {kVocab, -1, std::nullopt, "remote first token 32 >= vocab size 32"},
      {5, 2, std::nullopt, "entry is missing"},
      {5, 1, TokenLogprob{-0.5f, {{5, -0.5f}, {6, -1.5f}}}, "entry is malformed"},
      {5, 2, TokenLogprob{-0.5f, {{kVocab, -0.5f}}}, "entry is malformed"},
  };
  int64_t failures = 0;
  for (const Case& c : cases) {
    StartRemote(c.asked);
    std::optional<TokenLogprob> lp = c.lp;
    absl::Status s = holds_->Complete(RequestId(7), seq_.get(), c.token, &lp);
    EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
    EXPECT_THAT(s.message(), HasSubstr(c.message));
    EXPECT_THAT(s.message(), HasSubstr("prefilling locally"));
    EXPECT_EQ(holds_->num_failures(), ++failures);
    EXPECT_FALSE(seq_->remote_pending);
    EXPECT_FALSE(seq_->prefilled_remotely);
    EXPECT_EQ(seq_->num_computed, 0);
    EXPECT_EQ(kv_->Match(chain_), 0);  // nothing committed
    ASSERT_TRUE(kv_->Free(seq_->kv_id).ok());
  }
}

TEST_F(RemotePrefillHoldsTest, FailCountsAndEndsTheWait) {
  StartRemote();
  ASSERT_TRUE(holds_->Fail(RequestId(7), seq_.get()).ok());
  EXPECT_FALSE(seq_->remote_pending);
  EXPECT_EQ(holds_->num_failures(), 1);
  EXPECT_EQ(seq_->num_computed, 0);  // prefills locally into the same blocks
  EXPECT_TRUE(absl::IsNotFound(holds_->Fail(RequestId(7), seq_.get())));
}

TEST_F(RemotePrefillHoldsTest, ACancelledRequestOnlyEndsTheWait) {
  StartRemote();
  seq_->finished = FinishReason::kAbort;
  std::optional<TokenLogprob> lp;
  ASSERT_TRUE(holds_->Complete(RequestId(7), seq_.get(), 5, &lp).ok());
  EXPECT_FALSE(seq_->remote_pending);
  EXPECT_FALSE(seq_->prefilled_remotely);
  EXPECT_EQ(kv_->Match(chain_), 0);
  ASSERT_TRUE(kv_->Free(seq_->kv_id).ok());

  StartRemote();
  ASSERT_TRUE(holds_->Fail(RequestId(7), seq_.get()).ok());
  EXPECT_FALSE(seq_->remote_pending);
  EXPECT_EQ(holds_->num_failures(), 0);
}

TEST_F(RemotePrefillHoldsTest, NothingPendingIsNotFound) {
  std::optional<TokenLogprob> lp;
  absl::Status s = holds_->Complete(RequestId(9), nullptr, 5, &lp);
  EXPECT_TRUE(absl::IsNotFound(s)) << s;
  EXPECT_THAT(s.message(), HasSubstr("request 9 has no remote prefill outstanding"));
  EXPECT_TRUE(absl::IsNotFound(holds_->Complete(RequestId(7), seq_.get(), 5, &lp)));
  EXPECT_TRUE(absl::IsNotFound(holds_->Fail(RequestId(9), nullptr)));
  EXPECT_TRUE(absl::IsNotFound(holds_->Fail(RequestId(7), seq_.get())));
  EXPECT_EQ(holds_->num_failures(), 0);
}

TEST_F(RemotePrefillHoldsTest, PrefilledBlocksAreHeldUntilReleased) {
  std::vector<PrefilledBlocks> sent;
  seq_->request.on_prefilled = [&](PrefilledBlocks b) { sent.push_back(b); };
  ASSERT_TRUE(kv_->AllocatePrompt(seq_->kv_id, chain_, 10).ok());
  seq_->cached_tokens = 4;
  seq_->restored_tokens = 8;  // never reported above cached_tokens
  seq_->submitted = absl::FromUnixSeconds(100);
  seq_->first_scheduled = absl::FromUnixSeconds(103);
  seq_->prefill_done = absl::FromUnixSeconds(110);
  holds_->Prefilled(seq_.get(), 11, TokenLogprob{-0.25f, {}});
  ASSERT_EQ(sent.size(), 1u);
  EXPECT_EQ(sent[0].id, RequestId(7));
  EXPECT_EQ(sent[0].first_token, 11u);
  ASSERT_TRUE(sent[0].first_logprob.has_value());
  EXPECT_EQ(sent[0].first_logprob->logprob, -0.25f);
  EXPECT_THAT(sent[0].block_ids, ElementsAreArray(kv_->GetTable(seq_->kv_id)->blocks()));
  EXPECT_EQ(sent[0].cached_tokens, 4);
  EXPECT_EQ(sent[0].restored_tokens, 4);
  EXPECT_EQ(sent[0].queue, absl::Seconds(3));
  EXPECT_EQ(sent[0].prefill, absl::Seconds(7));
  EXPECT_TRUE(seq_->held);

  holds_->Hold(std::move(seq_));
  EXPECT_TRUE(holds_->Holds(RequestId(7)));
  EXPECT_FALSE(holds_->Holds(RequestId(8)));
  EXPECT_EQ(holds_->num_held(), 1);
  EXPECT_EQ(kv_->num_sequences(), 1);  // the blocks stay referenced
  absl::Status s = holds_->Release(RequestId(8));
  EXPECT_TRUE(absl::IsNotFound(s)) << s;
  EXPECT_THAT(s.message(), HasSubstr("request 8 holds no prefilled blocks"));
  ASSERT_TRUE(holds_->Release(RequestId(7)).ok());
  EXPECT_TRUE(holds_->empty());
  EXPECT_EQ(kv_->num_sequences(), 0);
  EXPECT_TRUE(absl::IsNotFound(holds_->Release(RequestId(7))));
}

}  // namespace
}  // namespace pd::engine
