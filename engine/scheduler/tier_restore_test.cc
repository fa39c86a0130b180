#include "engine/scheduler/tier_restore.h"

#include <memory>
#include <utility>
#include <vector>

#include "common/log/log.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pd::engine {
namespace {

using ::testing::ElementsAre;

constexpr int64_t kBlockSize = 4;
const kvcache::SequenceId kScratch(100);

// A pool of `num_blocks`, the chain of a 13-token prompt (3 full blocks) and a tier prefix
// whose copy_in records the blocks asked for and fails at index `fail_at`.
class TierRestoreTest : public ::testing::Test {
 protected:
  void SetUp() override { MakeCache(8); }

  void MakeCache(int64_t num_blocks) {
    absl::StatusOr<std::unique_ptr<kvcache::KvCacheManager>> kv =
        kvcache::KvCacheManager::Create({num_blocks, kBlockSize});
    CHECK(kv.ok()) << kv.status();
    kv_ = *std::move(kv);
    absl::StatusOr<BlockHash> seed = ComputeHashSeed({"model", "f32", kBlockSize, ""});
    CHECK(seed.ok()) << seed.status();
    prompt_ = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13};
    chain_ = ComputeBlockHashes(*seed, prompt_, kBlockSize);
  }

  TierPrefix Tier(int64_t first_block, std::vector<BlockHash> chain, int64_t fail_at = -1) {
    TierPrefix tier;
    tier.first_block = first_block;
    tier.chain = std::move(chain);
    tier.copy_in = [this, fail_at](int64_t index, BlockId) {
      copied_.push_back(index);
      return index != fail_at;
    };
    return tier;
  }

  TierRestoreResult Restore(const TierPrefix& tier, int64_t num_tokens = 13) {
    return RestoreFromTiers(kv_.get(), kScratch, tier, chain_, num_tokens);
  }

  std::unique_ptr<kvcache::KvCacheManager> kv_;
  std::vector<uint32_t> prompt_;
  std::vector<BlockHash> chain_;
  std::vector<int64_t> copied_;
};

TEST_F(TierRestoreTest, RestoredBlocksBecomePrefixCacheHits) {
  TierRestoreResult r = Restore(Tier(0, chain_));
  EXPECT_EQ(r.restored_blocks, 3);
  EXPECT_FALSE(r.copy_failed);
  EXPECT_THAT(copied_, ElementsAre(0, 1, 2));
  EXPECT_EQ(kv_->Match(chain_), 3);
  EXPECT_EQ(kv_->num_sequences(), 0);  // evictable, held by no one
}

TEST_F(TierRestoreTest, TheLastPromptTokensBlockIsAlwaysComputed) {
  TierRestoreResult r = Restore(Tier(0, chain_), 12);  // token 11 lies in block 2
  EXPECT_EQ(r.restored_blocks, 2);
  EXPECT_THAT(copied_, ElementsAre(0, 1));
}

TEST_F(TierRestoreTest, AFailedCopyStopsTheRestore) {
  TierRestoreResult r = Restore(Tier(0, chain_, /*fail_at=*/1));
  EXPECT_EQ(r.restored_blocks, 1);
  EXPECT_TRUE(r.copy_failed);
  EXPECT_EQ(kv_->Match(chain_), 1);
  EXPECT_EQ(kv_->num_sequences(), 0);
}

TEST_F(TierRestoreTest, ABlockOfAnotherChainIsNeverUsed) {
  std::vector<BlockHash> other = chain_;
  other[1] = chain_[2];
  TierRestoreResult r = Restore(Tier(0, other));
  EXPECT_EQ(r.restored_blocks, 1);
  EXPECT_FALSE(r.copy_failed);
  EXPECT_THAT(copied_, ElementsAre(0));
}

TEST_F(TierRestoreTest, OnlyWhatContinuesTheCachedPrefix) {
  // Nothing cached here and the tier starts at block 1: a gap, nothing restored.
  TierRestoreResult r = Restore(Tier(1, {chain_[1], chain_[2]}));
  EXPECT_EQ(r.restored_blocks, 0);
  EXPECT_TRUE(copied_.empty());

  // Block 0 cached here: the tier continues it from block 1.
  ASSERT_TRUE(kv_->AllocatePrompt(kvcache::SequenceId(1), {}, 5).ok());
  ASSERT_TRUE(kv_->CommitBlocks(kvcache::SequenceId(1), {chain_[0]}).ok());
  ASSERT_TRUE(kv_->Free(kvcache::SequenceId(1)).ok());
  r = Restore(Tier(0, chain_));
  EXPECT_EQ(r.restored_blocks, 2);
  EXPECT_THAT(copied_, ElementsAre(1, 2));
  EXPECT_EQ(kv_->Match(chain_), 3);
}

TEST_F(TierRestoreTest, NoRoomRestoresNothing) {
  MakeCache(2);
  ASSERT_TRUE(kv_->AllocatePrompt(kvcache::SequenceId(1), {}, 8).ok());  // both blocks
  TierRestoreResult r = Restore(Tier(0, chain_));
  EXPECT_EQ(r.restored_blocks, 0);
  EXPECT_FALSE(r.copy_failed);
  EXPECT_TRUE(copied_.empty());
  EXPECT_EQ(kv_->num_sequences(), 1);
}

}  // namespace
}  // namespace pd::engine
