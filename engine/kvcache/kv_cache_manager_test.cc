#include "engine/kvcache/kv_cache_manager.h"

#include <cstdint>
#include <iostream>
#include <map>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "engine/kvcache/recording_kv_event_listener.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pd::kvcache {
namespace {

using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using Kind = RecordingKvEventListener::Event::Kind;

constexpr int64_t kBlockSize = 4;

BlockHash Seed() { return BlockHash{.high = 1, .low = 2}; }

// Tokens first_token, first_token + 1, ...: prompts with the same first_token share a prefix.
std::vector<uint32_t> Tokens(int64_t n, uint32_t first_token = 100) {
  std::vector<uint32_t> t(n);
  std::iota(t.begin(), t.end(), first_token);
  return t;
}

std::vector<BlockHash> Chain(absl::Span<const uint32_t> tokens) {
  return ComputeBlockHashes(Seed(), tokens, kBlockSize);
}

SequenceId S(uint64_t n) { return SequenceId(n); }

class KvCacheManagerTest : public ::testing::Test {
 protected:
  void Make(int64_t num_blocks, BlockPool::EvictionHook hook = nullptr) {
    auto m = KvCacheManager::Create({.num_blocks = num_blocks, .block_size = kBlockSize}, &events_,
                                    std::move(hook));
    ASSERT_TRUE(m.ok()) << m.status();
    kv_ = *std::move(m);
  }
  int64_t MustAllocate(SequenceId seq, absl::Span<const uint32_t> tokens) {
    absl::StatusOr<int64_t> cached = kv_->AllocatePrompt(seq, Chain(tokens), tokens.size());
    EXPECT_TRUE(cached.ok()) << cached.status();
    return cached.value_or(-1);
  }
  std::vector<BlockId> Blocks(SequenceId seq) {
    const BlockTable* t = kv_->GetTable(seq);
    return t == nullptr ? std::vector<BlockId>{}
                        : std::vector<BlockId>(t->blocks().begin(), t->blocks().end());
  }
  void ExpectConsistent() {
    EXPECT_TRUE(kv_->pool().CheckInvariants().ok()) << kv_->pool().CheckInvariants();
  }

  RecordingKvEventListener events_;
  std::unique_ptr<KvCacheManager> kv_;
};

TEST_F(KvCacheManagerTest, ConfigIsValidated) {
  EXPECT_TRUE(absl::IsInvalidArgument(KvCacheManager::Create({.num_blocks = 0}).status()));
  EXPECT_TRUE(
      absl::IsInvalidArgument(KvCacheManager::Create({.num_blocks = 4, .block_size = 0}).status()));
  EXPECT_TRUE(KvCacheManager::Create({.num_blocks = 4}).ok());
}

TEST_F(KvCacheManagerTest, ColdPromptAllocatesCeilBlocks) {
  Make(8);
  EXPECT_EQ(MustAllocate(S(1), Tokens(9)), 0);
  EXPECT_EQ(kv_->GetTable(S(1))->num_blocks(), 3);
  EXPECT_EQ(kv_->GetTable(S(1))->num_tokens(), 9);
  const KvCacheStats s = kv_->Stats();
  EXPECT_EQ(s.num_blocks_used, 3);
  EXPECT_EQ(s.num_blocks_free, 5);
  EXPECT_EQ(s.num_sequences, 1);
  EXPECT_EQ(s.prefix_queries, 1);
  EXPECT_EQ(s.prefix_query_tokens, 9);
  EXPECT_EQ(s.prefix_hit_blocks, 0);
  EXPECT_TRUE(events_.events().empty());  // nothing is cached before a commit
  EXPECT_EQ(kv_->Match(Chain(Tokens(9))), 0);
}

TEST_F(KvCacheManagerTest, SharedPrefixSharesPhysicalBlocks) {
  Make(16);
  const std::vector<uint32_t> a = Tokens(10);
  std::vector<uint32_t> b = Tokens(8);  // same first two blocks, then a different tail
  b.insert(b.end(), {7, 7, 7, 7, 7});
  EXPECT_EQ(MustAllocate(S(1), a), 0);
  ASSERT_TRUE(kv_->CommitBlocks(S(1), Chain(a)).ok());
  EXPECT_EQ(kv_->Match(Chain(b)), 2);
  EXPECT_EQ(MustAllocate(S(2), b), 8);
  const std::vector<BlockId> ba = Blocks(S(1));
  const std::vector<BlockId> bb = Blocks(S(2));
  ASSERT_EQ(bb.size(), 4u);
  EXPECT_EQ(bb[0], ba[0]);
  EXPECT_EQ(bb[1], ba[1]);
  EXPECT_NE(bb[2], ba[2]);
  EXPECT_EQ(kv_->pool().ref_count(ba[0]), 2);
  EXPECT_EQ(kv_->pool().ref_count(ba[1]), 2);
  EXPECT_EQ(kv_->pool().ref_count(ba[2]), 1);
  EXPECT_EQ(kv_->GetTable(S(2))->num_cached_blocks(), 2);
  EXPECT_EQ(kv_->Stats().prefix_hit_tokens, 8);
  EXPECT_EQ(kv_->Stats().num_blocks_used, 3 + 2);

  // Freeing one sharer keeps the blocks used; freeing both makes them evictable hits.
  ASSERT_TRUE(kv_->Free(S(1)).ok());
  EXPECT_EQ(kv_->pool().ref_count(ba[0]), 1);
  EXPECT_EQ(kv_->Stats().num_blocks_cached, 0);
  ASSERT_TRUE(kv_->Free(S(2)).ok());
  EXPECT_EQ(kv_->Stats().num_blocks_cached, 2);
  EXPECT_EQ(kv_->Match(Chain(a)), 2);
  ExpectConsistent();
}

TEST_F(KvCacheManagerTest, FullyCachedPromptRecomputesItsLastBlock) {
  Make(8);
  const std::vector<uint32_t> p = Tokens(12);  // exactly three full blocks
  EXPECT_EQ(MustAllocate(S(1), p), 0);
  ASSERT_TRUE(kv_->CommitBlocks(S(1), Chain(p)).ok());
  EXPECT_EQ(kv_->Match(Chain(p)), 3);
  EXPECT_EQ(MustAllocate(S(2), p), 8);  // not 12: the last token must be computed
  EXPECT_NE(Blocks(S(2))[2], Blocks(S(1))[2]);
  EXPECT_EQ(kv_->pool().ref_count(Blocks(S(2))[2]), 1);
  // Committing S(2)'s recomputed last block finds S(1)'s and keeps it (duplicate).
  ASSERT_TRUE(kv_->CommitBlocks(S(2), Chain(p)).ok());
  EXPECT_FALSE(kv_->pool().hash(Blocks(S(2))[2]).has_value());
  EXPECT_EQ(kv_->GetTable(S(2))->num_committed_blocks(), 3);
  ExpectConsistent();
}

TEST_F(KvCacheManagerTest, AllocatePromptIsAllOrNothing) {
  Make(4);
  EXPECT_EQ(MustAllocate(S(1), Tokens(9, 500)), 0);  // 3 blocks
  events_.Clear();
  const KvCacheStats before = kv_->Stats();
  absl::StatusOr<int64_t> r = kv_->AllocatePrompt(S(2), Chain(Tokens(5)), 5);  // needs 2
  EXPECT_TRUE(absl::IsResourceExhausted(r.status())) << r.status();
  EXPECT_EQ(kv_->GetTable(S(2)), nullptr);
  const KvCacheStats after = kv_->Stats();
  EXPECT_EQ(after.num_blocks_free, before.num_blocks_free);
  EXPECT_EQ(after.prefix_queries, before.prefix_queries);
  EXPECT_EQ(after.allocation_failures, before.allocation_failures + 1);
  EXPECT_FALSE(kv_->CanAllocate(2));
  EXPECT_TRUE(kv_->CanAllocate(1));
  ExpectConsistent();
}

TEST_F(KvCacheManagerTest, EvictableHitsDoNotCountAsFreeForTheSamePrompt) {
  Make(3);
  const std::vector<uint32_t> p = Tokens(9);  // 2 full blocks + 1 partial
  EXPECT_EQ(MustAllocate(S(1), p), 0);
  ASSERT_TRUE(kv_->CommitBlocks(S(1), Chain(p)).ok());
  ASSERT_TRUE(kv_->Free(S(1)).ok());
  EXPECT_EQ(kv_->NumFreeBlocks(), 3);  // 1 free + 2 cached
  // Same prompt: 2 hits (taken off the LRU) + 1 fresh block: fits exactly.
  EXPECT_EQ(MustAllocate(S(2), p), 8);
  ASSERT_TRUE(kv_->Free(S(2)).ok());
  // Shares only the first block: 1 hit + 3 fresh > 3 - 1 allocatable, although 3 "free".
  std::vector<uint32_t> q = Tokens(4);
  q.resize(13, 9);
  absl::StatusOr<int64_t> r = kv_->AllocatePrompt(S(3), Chain(q), q.size());
  EXPECT_TRUE(absl::IsResourceExhausted(r.status())) << r.status();
  EXPECT_EQ(kv_->Stats().num_blocks_cached, 2);  // the failed call evicted nothing
  EXPECT_EQ(kv_->Stats().evictions, 0);
  ExpectConsistent();
}

TEST_F(KvCacheManagerTest, AppendTokensGrowsAtBlockBoundaries) {
  Make(3);
  EXPECT_EQ(MustAllocate(S(1), Tokens(3)), 0);
  EXPECT_EQ(kv_->BlocksNeededToAppend(S(1), 1).value(), 0);
  ASSERT_TRUE(kv_->AppendTokens(S(1), 1).ok());  // fills block 0
  EXPECT_EQ(kv_->GetTable(S(1))->num_blocks(), 1);
  EXPECT_EQ(kv_->BlocksNeededToAppend(S(1), 1).value(), 1);
  ASSERT_TRUE(kv_->AppendTokens(S(1), 1).ok());
  EXPECT_EQ(kv_->GetTable(S(1))->num_blocks(), 2);
  EXPECT_EQ(kv_->GetTable(S(1))->num_tokens(), 5);
  ASSERT_TRUE(kv_->AppendTokens(S(1), 0).ok());
  // 5 + 8 tokens need 4 blocks, the pool has 3: nothing changes.
  EXPECT_EQ(kv_->BlocksNeededToAppend(S(1), 8).value(), 2);
  EXPECT_TRUE(absl::IsResourceExhausted(kv_->AppendTokens(S(1), 8)));
  EXPECT_EQ(kv_->GetTable(S(1))->num_blocks(), 2);
  EXPECT_EQ(kv_->GetTable(S(1))->num_tokens(), 5);
  EXPECT_EQ(kv_->Stats().allocation_failures, 1);
  ASSERT_TRUE(kv_->AppendTokens(S(1), 7).ok());
  EXPECT_EQ(kv_->GetTable(S(1))->num_blocks(), 3);
  EXPECT_TRUE(absl::IsInvalidArgument(kv_->AppendTokens(S(1), -1)));
  EXPECT_TRUE(absl::IsNotFound(kv_->AppendTokens(S(9), 1)));
  ExpectConsistent();
}

// The sink + window policy's two operations: the forked originals stay referenced (and
// cached, untouched) until Free; a dropped block leaves the table at once and keeps its hash.
TEST_F(KvCacheManagerTest, ForkAndDropKeepTheOriginalsAndReleaseTheDropped) {
  Make(8);
  const std::vector<uint32_t> tokens = Tokens(13);  // 3 full blocks + 1 token
  EXPECT_EQ(MustAllocate(S(1), tokens), 0);
  const std::vector<BlockHash> chain = Chain(tokens);
  ASSERT_TRUE(kv_->CommitBlocks(S(1), chain).ok());
  const std::vector<BlockId> before = Blocks(S(1));
  ASSERT_EQ(before.size(), 4u);

  absl::StatusOr<std::vector<BlockId>> fresh = kv_->ForkLeadingBlocks(S(1), 1);
  ASSERT_TRUE(fresh.ok()) << fresh.status();
  ASSERT_EQ(fresh->size(), 1u);
  EXPECT_THAT(Blocks(S(1)), ElementsAre((*fresh)[0], before[1], before[2], before[3]));
  EXPECT_THAT(kv_->GetTable(S(1))->set_aside(), ElementsAre(before[0]));
  EXPECT_TRUE(kv_->GetTable(S(1))->windowed());
  EXPECT_EQ(kv_->pool().ref_count(before[0]), 1);
  EXPECT_EQ(kv_->Stats().num_blocks_used, 5);
  EXPECT_TRUE(absl::IsInvalidArgument(kv_->ForkLeadingBlocks(S(1), 1).status()));  // once
  EXPECT_TRUE(absl::IsFailedPrecondition(kv_->CommitBlocks(S(1), chain)));

  ASSERT_TRUE(kv_->DropBlock(S(1), 1).ok());  // text block 1
  EXPECT_THAT(Blocks(S(1)), ElementsAre((*fresh)[0], before[2], before[3]));
  EXPECT_EQ(kv_->GetTable(S(1))->num_tokens(), 9);
  EXPECT_EQ(kv_->pool().ref_count(before[1]), 0);
  EXPECT_TRUE(kv_->pool().IsEvictable(before[1]));  // still a prefix-cache hit
  EXPECT_EQ(kv_->Match(chain), 3);
  EXPECT_TRUE(absl::IsInvalidArgument(kv_->DropBlock(S(1), 2)));  // the last block
  EXPECT_TRUE(absl::IsInvalidArgument(kv_->DropBlock(S(1), -1)));
  EXPECT_TRUE(absl::IsNotFound(kv_->DropBlock(S(9), 0)));
  ExpectConsistent();

  // Appending past the window reuses the dropped block only after the free ones.
  ASSERT_TRUE(kv_->AppendTokens(S(1), 4).ok());
  EXPECT_EQ(kv_->GetTable(S(1))->num_blocks(), 4);
  ASSERT_TRUE(kv_->Free(S(1)).ok());
  EXPECT_EQ(kv_->Stats().num_blocks_used, 0);
  EXPECT_TRUE(kv_->pool().IsEvictable(before[0]));  // the original sink block is cached again
  EXPECT_EQ(kv_->Match(chain), 3);
  ExpectConsistent();
}

TEST_F(KvCacheManagerTest, ForkChecksItsArgumentsAndIsAllOrNothing) {
  Make(3);
  EXPECT_EQ(MustAllocate(S(1), Tokens(6)), 0);  // 2 blocks, the second partial
  EXPECT_TRUE(absl::IsInvalidArgument(kv_->ForkLeadingBlocks(S(1), 0).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(kv_->ForkLeadingBlocks(S(1), 2).status()));  // all
  EXPECT_TRUE(absl::IsInvalidArgument(kv_->DropBlock(S(1), 1)));  // partial and last
  EXPECT_TRUE(absl::IsNotFound(kv_->ForkLeadingBlocks(S(2), 1).status()));
  EXPECT_EQ(MustAllocate(S(2), Tokens(1, 7)), 0);  // the pool is full now
  EXPECT_TRUE(absl::IsResourceExhausted(kv_->ForkLeadingBlocks(S(1), 1).status()));
  EXPECT_FALSE(kv_->GetTable(S(1))->windowed());
  EXPECT_TRUE(kv_->GetTable(S(1))->set_aside().empty());
  ExpectConsistent();
}

// H2O / SnapKV: the kept tokens move into fresh private blocks; the old ones go back, a
// committed one staying a prefix-cache hit (it still holds the full prefix).
TEST_F(KvCacheManagerTest, ReplaceBlocksFillsFreshBlocksThenReleasesTheOldOnes) {
  Make(8);
  const std::vector<uint32_t> tokens = Tokens(14);  // 4 blocks, the last partial
  EXPECT_EQ(MustAllocate(S(1), tokens), 0);
  const std::vector<BlockHash> chain = Chain(tokens);
  ASSERT_TRUE(kv_->CommitBlocks(S(1), chain).ok());
  const std::vector<BlockId> before = Blocks(S(1));
  std::vector<BlockId> seen_old, seen_fresh;
  ASSERT_TRUE(
      kv_->ReplaceBlocks(S(1), 7,
                         [&](absl::Span<const BlockId> old, absl::Span<const BlockId> fresh) {
                           seen_old.assign(old.begin(), old.end());
                           seen_fresh.assign(fresh.begin(), fresh.end());
                           EXPECT_EQ(kv_->pool().ref_count(old[0]), 1);  // still held
                           return absl::OkStatus();
                         })
          .ok());
  EXPECT_EQ(seen_old, before);
  ASSERT_EQ(seen_fresh.size(), 2u);
  EXPECT_EQ(Blocks(S(1)), seen_fresh);
  EXPECT_EQ(kv_->GetTable(S(1))->num_tokens(), 7);
  EXPECT_TRUE(kv_->GetTable(S(1))->windowed());
  EXPECT_TRUE(absl::IsFailedPrecondition(kv_->CommitBlocks(S(1), chain)));
  EXPECT_EQ(kv_->Stats().num_blocks_used, 2);
  EXPECT_TRUE(kv_->pool().IsEvictable(before[0]));
  EXPECT_EQ(kv_->Match(chain), 3);
  ExpectConsistent();
  ASSERT_TRUE(kv_->AppendTokens(S(1), 2).ok());  // grows on from the kept tokens
  EXPECT_EQ(kv_->GetTable(S(1))->num_blocks(), 3);
  ASSERT_TRUE(kv_->Free(S(1)).ok());
  ExpectConsistent();
}

TEST_F(KvCacheManagerTest, ReplaceBlocksChecksItsArgumentsAndIsAllOrNothing) {
  Make(3);
  EXPECT_EQ(MustAllocate(S(1), Tokens(6)), 0);  // 2 blocks
  auto ok = [](absl::Span<const BlockId>, absl::Span<const BlockId>) { return absl::OkStatus(); };
  EXPECT_TRUE(absl::IsInvalidArgument(kv_->ReplaceBlocks(S(1), 0, ok)));
  EXPECT_TRUE(absl::IsInvalidArgument(kv_->ReplaceBlocks(S(1), 7, ok)));
  EXPECT_TRUE(absl::IsNotFound(kv_->ReplaceBlocks(S(2), 1, ok)));
  const std::vector<BlockId> before = Blocks(S(1));
  EXPECT_TRUE(absl::IsResourceExhausted(kv_->ReplaceBlocks(S(1), 6, ok)));  // 1 block free
  auto fail = [](absl::Span<const BlockId>, absl::Span<const BlockId>) {
    return absl::InternalError("copy failed");
  };
  EXPECT_EQ(kv_->ReplaceBlocks(S(1), 3, fail).message(), "copy failed");
  EXPECT_EQ(Blocks(S(1)), before);
  EXPECT_FALSE(kv_->GetTable(S(1))->windowed());
  EXPECT_EQ(kv_->Stats().num_blocks_used, 2);
  ExpectConsistent();
}

TEST_F(KvCacheManagerTest, CommitDuringDecodeEmitsChainedEventsInOrder) {
  Make(8);
  std::vector<uint32_t> tokens = Tokens(6);
  EXPECT_EQ(MustAllocate(S(1), tokens), 0);
  std::vector<BlockHash> chain = Chain(tokens);
  ASSERT_TRUE(kv_->CommitBlocks(S(1), chain).ok());
  // Decode 6 more tokens one at a time, committing whenever a block fills.
  for (int i = 0; i < 6; ++i) {
    ASSERT_TRUE(kv_->AppendTokens(S(1), 1).ok());
    tokens.push_back(1000 + i);
    ExtendBlockHashes(Seed(), tokens, kBlockSize, &chain);
    ASSERT_TRUE(kv_->CommitBlocks(S(1), chain).ok());
  }
  ASSERT_EQ(chain.size(), 3u);
  ASSERT_EQ(events_.events().size(), 3u);
  for (int i = 0; i < 3; ++i) {
    const auto& e = events_.events()[i];
    EXPECT_EQ(e.kind, Kind::kStored);
    EXPECT_THAT(e.hashes, ElementsAre(chain[i]));
    EXPECT_EQ(e.parent, i == 0 ? std::nullopt : std::optional<BlockHash>(chain[i - 1]));
  }
  EXPECT_EQ(kv_->GetTable(S(1))->num_committed_blocks(), 3);
  // Repeating is free; a chain longer than the full blocks is rejected.
  ASSERT_TRUE(kv_->CommitBlocks(S(1), chain).ok());
  EXPECT_EQ(events_.events().size(), 3u);
  chain.push_back(BlockHash{.high = 9, .low = 9});
  EXPECT_TRUE(absl::IsInvalidArgument(kv_->CommitBlocks(S(1), chain)));
  EXPECT_TRUE(absl::IsNotFound(kv_->CommitBlocks(S(2), chain)));
}

TEST_F(KvCacheManagerTest, ConcurrentColdPromptsBecomeDuplicates) {
  Make(8);
  const std::vector<uint32_t> p = Tokens(9);
  EXPECT_EQ(MustAllocate(S(1), p), 0);
  EXPECT_EQ(MustAllocate(S(2), p), 0);  // admitted before S(1) committed: no sharing
  ASSERT_TRUE(kv_->CommitBlocks(S(1), Chain(p)).ok());
  ASSERT_TRUE(kv_->CommitBlocks(S(2), Chain(p)).ok());
  ASSERT_EQ(events_.events().size(), 1u);  // S(2)'s copies are not announced
  EXPECT_EQ(kv_->Stats().num_cached_hashes, 2);
  EXPECT_EQ(kv_->pool().Lookup(Chain(p)[0]), Blocks(S(1))[0]);
  // S(2) frees first: its duplicates go to the free list, S(1)'s hashes stay.
  ASSERT_TRUE(kv_->Free(S(2)).ok());
  EXPECT_EQ(kv_->Stats().num_blocks_cached, 0);
  EXPECT_EQ(kv_->Stats().num_blocks_free, 5);
  ASSERT_TRUE(kv_->Free(S(1)).ok());
  EXPECT_EQ(kv_->Stats().num_blocks_cached, 2);
  ExpectConsistent();
}

TEST_F(KvCacheManagerTest, FreeEvictsChainTailFirstAndHookSeesHashBeforeReuse) {
  std::vector<std::pair<BlockHash, BlockId>> hooked;
  Make(4, [&](const BlockHash& h, BlockId b) {
    hooked.push_back({h, b});
    // Called before the block is handed out: no table holds it yet.
    EXPECT_EQ(kv_->pool().ref_count(b), 0);
  });
  const std::vector<uint32_t> p = Tokens(13);  // 3 full blocks + 1 partial: the whole pool
  EXPECT_EQ(MustAllocate(S(1), p), 0);
  const std::vector<BlockHash> chain = Chain(p);
  ASSERT_TRUE(kv_->CommitBlocks(S(1), chain).ok());
  const std::vector<BlockId> b = Blocks(S(1));
  ASSERT_TRUE(kv_->Free(S(1)).ok());
  // Released last block first: the chain head is the most recently used.
  EXPECT_THAT(kv_->pool().EvictableBlocksInLruOrder(), ElementsAre(b[2], b[1], b[0]));
  events_.Clear();

  // 2 blocks: the unhashed free one, then the chain's tail.
  EXPECT_EQ(MustAllocate(S(2), Tokens(8, 7000)), 0);
  ASSERT_EQ(hooked.size(), 1u);
  EXPECT_EQ(hooked[0].first, chain[2]);
  EXPECT_EQ(hooked[0].second, b[2]);
  EXPECT_THAT(Blocks(S(2)), ElementsAre(b[3], b[2]));
  ASSERT_EQ(events_.events().size(), 1u);
  EXPECT_EQ(events_.events()[0].kind, Kind::kRemoved);
  EXPECT_THAT(events_.events()[0].hashes, ElementsAre(chain[2]));
  EXPECT_EQ(kv_->Match(chain), 2);  // the head of the chain is still a hit
  EXPECT_EQ(kv_->Stats().evictions, 1);
  ExpectConsistent();
}

TEST_F(KvCacheManagerTest, EvictionFollowsLeastRecentlyUsedAcrossSequences) {
  Make(6);
  const std::vector<uint32_t> x = Tokens(5, 100), y = Tokens(5, 200), z = Tokens(5, 300);
  for (auto [seq, p] : {std::pair{S(1), &x}, std::pair{S(2), &y}, std::pair{S(3), &z}}) {
    EXPECT_EQ(MustAllocate(seq, *p), 0);
    ASSERT_TRUE(kv_->CommitBlocks(seq, Chain(*p)).ok());
  }
  ASSERT_TRUE(kv_->Free(S(2)).ok());
  ASSERT_TRUE(kv_->Free(S(1)).ok());
  ASSERT_TRUE(kv_->Free(S(3)).ok());
  // A hit refreshes x's block: it leaves the LRU and returns at the back when freed.
  EXPECT_EQ(MustAllocate(S(4), x), 4);
  ASSERT_TRUE(kv_->Free(S(4)).ok());
  events_.Clear();
  // 3 free + 3 cached (y, z, x from oldest): taking 5 evicts y then z, keeps x.
  EXPECT_EQ(MustAllocate(S(5), Tokens(20, 900)), 0);
  ASSERT_EQ(events_.events().size(), 1u);
  EXPECT_THAT(events_.events()[0].hashes, ElementsAre(Chain(y)[0], Chain(z)[0]));
  EXPECT_EQ(kv_->Match(Chain(x)), 1);
  ExpectConsistent();
}

TEST_F(KvCacheManagerTest, ImportAllocatesDestinationsAndCommitsAfterTheWrite) {
  Make(8);
  const std::vector<uint32_t> p = Tokens(10);
  const std::vector<BlockHash> chain = Chain(p);
  // A first prompt sharing block 0 is cached locally.
  EXPECT_EQ(MustAllocate(S(1), Tokens(4)), 0);
  ASSERT_TRUE(kv_->CommitBlocks(S(1), Chain(Tokens(4))).ok());
  ASSERT_TRUE(kv_->Free(S(1)).ok());

  absl::StatusOr<ImportTarget> t = kv_->ImportBlocks(S(2), chain, p.size());
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->num_cached_tokens, 4);
  EXPECT_EQ(t->first_block, 1);
  const std::vector<BlockId> all = Blocks(S(2));
  EXPECT_THAT(t->block_ids, ElementsAre(all[1], all[2]));
  EXPECT_THAT(kv_->ExportBlocks(S(2), 1, 2).value(), ElementsAreArray(t->block_ids));
  // Until committed, the imported blocks are not hits.
  EXPECT_EQ(kv_->Match(chain), 1);
  ASSERT_TRUE(kv_->CommitBlocks(S(2), chain).ok());  // the remote write has completed
  EXPECT_EQ(kv_->Match(chain), 2);
}

TEST_F(KvCacheManagerTest, FailedImportNeverCachesUnwrittenBlocks) {
  Make(4);
  const std::vector<uint32_t> p = Tokens(10);
  absl::StatusOr<ImportTarget> t = kv_->ImportBlocks(S(1), Chain(p), p.size());
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->block_ids.size(), 3u);
  ASSERT_TRUE(kv_->Free(S(1)).ok());  // transfer failed
  EXPECT_EQ(kv_->Match(Chain(p)), 0);
  EXPECT_EQ(kv_->Stats().num_blocks_free, 4);
  EXPECT_TRUE(events_.events().empty());
}

// A SnapKV prompt compressed remotely: fresh private blocks for the kept tokens, never
// committed (the table is windowed: its slots are not the text's positions).
TEST_F(KvCacheManagerTest, CompressedImportIsPrivateAndNeverCommitted) {
  Make(8);
  const std::vector<uint32_t> p = Tokens(9);  // 3 blocks, the first 2 full
  ASSERT_EQ(MustAllocate(S(1), p), 0);
  ASSERT_TRUE(kv_->CommitBlocks(S(1), Chain(p)).ok());
  absl::StatusOr<ImportTarget> t = kv_->ImportCompressedBlocks(S(2), 5);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->num_cached_tokens, 0);  // (the cached prefix is not taken)
  EXPECT_EQ(t->first_block, 0);
  EXPECT_EQ(t->block_ids.size(), 2u);
  EXPECT_TRUE(kv_->GetTable(S(2))->windowed());
  EXPECT_TRUE(absl::IsFailedPrecondition(kv_->CommitBlocks(S(2), Chain(Tokens(4)))));
  EXPECT_TRUE(absl::IsResourceExhausted(kv_->ImportCompressedBlocks(S(3), 13).status()));
  EXPECT_TRUE(absl::IsAlreadyExists(kv_->ImportCompressedBlocks(S(2), 1).status()));
}

TEST_F(KvCacheManagerTest, ExportBlocksChecksTheRange) {
  Make(4);
  EXPECT_EQ(MustAllocate(S(1), Tokens(9)), 0);
  EXPECT_THAT(kv_->ExportBlocks(S(1), 0, 3).value(), ElementsAreArray(Blocks(S(1))));
  EXPECT_TRUE(kv_->ExportBlocks(S(1), 3, 0).value().empty());
  EXPECT_TRUE(absl::IsOutOfRange(kv_->ExportBlocks(S(1), 1, 3).status()));
  EXPECT_TRUE(absl::IsOutOfRange(kv_->ExportBlocks(S(1), -1, 1).status()));
  EXPECT_TRUE(absl::IsNotFound(kv_->ExportBlocks(S(2), 0, 1).status()));
}

TEST_F(KvCacheManagerTest, PreemptedSequenceIsReadmittedFromItsCache) {
  Make(8);
  std::vector<uint32_t> tokens = Tokens(7);
  EXPECT_EQ(MustAllocate(S(1), tokens), 0);
  ASSERT_TRUE(kv_->AppendTokens(S(1), 2).ok());
  tokens.insert(tokens.end(), {55, 56});
  ASSERT_TRUE(kv_->CommitBlocks(S(1), Chain(tokens)).ok());
  ASSERT_TRUE(kv_->Free(S(1)).ok());         // preempted
  EXPECT_EQ(MustAllocate(S(1), tokens), 8);  // recompute only the last token
}

TEST_F(KvCacheManagerTest, ArgumentErrors) {
  Make(4);
  EXPECT_TRUE(absl::IsInvalidArgument(kv_->AllocatePrompt(S(1), {}, 0).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(kv_->AllocatePrompt(SequenceId(), {}, 3).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(kv_->AllocatePrompt(S(1), Chain(Tokens(8)), 7).status()));
  EXPECT_EQ(MustAllocate(S(1), Tokens(3)), 0);
  EXPECT_TRUE(absl::IsAlreadyExists(kv_->AllocatePrompt(S(1), {}, 3).status()));
  EXPECT_TRUE(absl::IsNotFound(kv_->Free(S(2))));
  EXPECT_TRUE(absl::IsNotFound(kv_->BlocksNeededToAppend(S(2), 1).status()));
  // A prompt may pass fewer hashes than full blocks (no reuse beyond them).
  EXPECT_TRUE(kv_->AllocatePrompt(S(3), {}, 8).ok());
}

TEST_F(KvCacheManagerTest, ResetPrefixCacheForgetsEverything) {
  Make(4);
  const std::vector<uint32_t> p = Tokens(8);
  EXPECT_EQ(MustAllocate(S(1), p), 0);
  ASSERT_TRUE(kv_->CommitBlocks(S(1), Chain(p)).ok());
  kv_->ResetPrefixCache();
  EXPECT_EQ(kv_->Match(Chain(p)), 0);
  EXPECT_EQ(events_.events().back().kind, Kind::kAllCleared);
  ASSERT_TRUE(kv_->Free(S(1)).ok());
  EXPECT_EQ(kv_->Stats().num_blocks_free, 4);
  ExpectConsistent();
}

// Everything that must hold between operations of the randomized test: the pool's own
// invariants, refcounts == number of tables holding a block, states partition the pool, and the
// event stream replays to exactly the hashes the pool can hit.
struct ModelSeq {
  std::vector<uint32_t> tokens;
  std::vector<BlockHash> chain;  // of the full blocks of tokens
};

void CheckModel(const KvCacheManager& manager, const std::map<SequenceId, ModelSeq>& live,
                const RecordingKvEventListener& events, int64_t hook_calls, int op) {
  const KvCacheManager* kv = &manager;
  const int64_t num_blocks = kv->num_blocks();
  ASSERT_TRUE(kv->pool().CheckInvariants().ok()) << kv->pool().CheckInvariants();
  absl::flat_hash_map<BlockId, int32_t> refs;
  for (const auto& [seq, s] : live) {
    const BlockTable* t = kv->GetTable(seq);
    ASSERT_NE(t, nullptr);
    ASSERT_EQ(t->num_tokens(), static_cast<int64_t>(s.tokens.size()));
    ASSERT_EQ(t->num_blocks(), kv->NumBlocksForTokens(t->num_tokens()));
    absl::flat_hash_set<BlockId> in_table(t->blocks().begin(), t->blocks().end());
    ASSERT_EQ(in_table.size(), t->blocks().size()) << "a table holds a block twice";
    for (BlockId b : t->blocks()) {
      ++refs[b];
    }
  }
  ASSERT_EQ(kv->num_sequences(), static_cast<int64_t>(live.size()));
  for (uint32_t b = 0; b < num_blocks; ++b) {
    auto it = refs.find(BlockId(b));
    ASSERT_EQ(kv->pool().ref_count(BlockId(b)), it == refs.end() ? 0 : it->second)
        << "block " << b << " after op " << op;
  }
  const KvCacheStats st = kv->Stats();
  ASSERT_EQ(st.num_blocks_free + st.num_blocks_cached + st.num_blocks_used, num_blocks);
  ASSERT_EQ(st.num_blocks_used, static_cast<int64_t>(refs.size()));
  ASSERT_EQ(st.evictions, hook_calls);
  // Replaying the events gives exactly the hashes the pool can hit.
  absl::flat_hash_set<BlockHash> held;
  for (uint32_t b = 0; b < num_blocks; ++b) {
    if (auto h = kv->pool().hash(BlockId(b))) {
      held.insert(*h);
    }
  }
  ASSERT_EQ(events.Replay(), held) << "after op " << op;
  ASSERT_EQ(events.num_inconsistent(), 0) << "after op " << op;
}

// Thousands of random operations against a model of what the pool must look like. A shadow
// "KV content" per physical block checks the property everything else serves: a prefix-cache
// hit always returns blocks holding exactly the prompt's tokens, and no block is written while
// shared or cached.
TEST(KvCacheManagerRandomTest, InvariantsHoldUnderRandomOperations) {
  constexpr int64_t kNumBlocks = 48;
  constexpr int kNumOps = 6000;
  RecordingKvEventListener events;
  int64_t hook_calls = 0;
  absl::flat_hash_map<BlockId, std::vector<uint32_t>> content;  // tokens written in each block
  std::unique_ptr<KvCacheManager> kv;
  auto created = KvCacheManager::Create({.num_blocks = kNumBlocks, .block_size = kBlockSize},
                                        &events, [&](const BlockHash& hash, BlockId block) {
                                          ++hook_calls;
                                          // The evicted block still holds the data its hash names.
                                          EXPECT_EQ(kv->pool().hash(block), hash);
                                          EXPECT_EQ(kv->pool().ref_count(block), 0);
                                        });
  ASSERT_TRUE(created.ok());
  kv = *std::move(created);

  std::mt19937_64 rng(20240611);
  auto uniform = [&](int64_t lo, int64_t hi) {  // [lo, hi]
    return lo + static_cast<int64_t>(rng() % static_cast<uint64_t>(hi - lo + 1));
  };
  using Seq = ModelSeq;
  // Ordered, so that picking the k-th sequence is reproducible (absl iteration order is not).
  std::map<SequenceId, Seq> live;
  uint64_t next_seq = 1;
  // A few shared "system prompts" make prefix hits and sharing frequent.
  std::vector<std::vector<uint32_t>> prefixes;
  for (int i = 0; i < 4; ++i) {
    prefixes.push_back(Tokens(uniform(2, 14), 1000 * (i + 1)));
  }
  auto write = [&](SequenceId seq, const Seq& s, int64_t from_token) {
    const BlockTable& t = *kv->GetTable(seq);
    for (int64_t pos = from_token; pos < static_cast<int64_t>(s.tokens.size()); ++pos) {
      const BlockId b = t.blocks()[pos / kBlockSize];
      ASSERT_EQ(kv->pool().ref_count(b), 1) << "write into shared block " << b;
      ASSERT_FALSE(kv->pool().hash(b).has_value()) << "write into cached block " << b;
      std::vector<uint32_t>& c = content[b];
      c.resize(pos % kBlockSize);  // a reused block starts over
      c.push_back(s.tokens[pos]);
    }
  };
  int64_t allocs = 0, alloc_failures = 0, hits = 0, appends = 0, commits = 0, frees = 0;

  for (int op = 0; op < kNumOps; ++op) {
    const int64_t kind = uniform(0, 99);
    if (kind < 30 || live.empty()) {  // admit a prompt
      Seq s;
      s.tokens = prefixes[uniform(0, 3)];
      const int64_t extra = uniform(0, 12);
      const uint32_t variant = static_cast<uint32_t>(uniform(0, 2));  // few distinct tails
      for (int64_t i = 0; i < extra; ++i) {
        s.tokens.push_back(variant * 10 + static_cast<uint32_t>(i));
      }
      s.chain = Chain(s.tokens);
      const SequenceId seq(next_seq++);
      absl::StatusOr<int64_t> cached = kv->AllocatePrompt(seq, s.chain, s.tokens.size());
      ++allocs;
      if (!cached.ok()) {
        ASSERT_TRUE(absl::IsResourceExhausted(cached.status())) << cached.status();
        ASSERT_EQ(kv->GetTable(seq), nullptr);
        ++alloc_failures;
      } else {
        hits += *cached > 0;
        const BlockTable& t = *kv->GetTable(seq);
        for (int64_t i = 0; i < *cached / kBlockSize; ++i) {  // hits hold our tokens
          const std::vector<uint32_t> expect(s.tokens.begin() + i * kBlockSize,
                                             s.tokens.begin() + (i + 1) * kBlockSize);
          ASSERT_EQ(content[t.blocks()[i]], expect) << "wrong KV from the prefix cache";
        }
        write(seq, s, *cached);
        live[seq] = std::move(s);
      }
    } else if (kind < 60) {  // decode a few tokens
      auto it = live.begin();
      std::advance(it, uniform(0, static_cast<int64_t>(live.size()) - 1));
      const int64_t n = uniform(1, 6);
      const int64_t before = it->second.tokens.size();
      absl::Status st = kv->AppendTokens(it->first, n);
      if (st.ok()) {
        for (int64_t i = 0; i < n; ++i) {
          it->second.tokens.push_back(static_cast<uint32_t>(uniform(0, 3)));
        }
        ExtendBlockHashes(Seed(), it->second.tokens, kBlockSize, &it->second.chain);
        write(it->first, it->second, before);
        ++appends;
      } else {
        ASSERT_TRUE(absl::IsResourceExhausted(st)) << st;
        ASSERT_EQ(kv->GetTable(it->first)->num_tokens(), before);
      }
    } else if (kind < 80) {  // commit some or all computed full blocks
      auto it = live.begin();
      std::advance(it, uniform(0, static_cast<int64_t>(live.size()) - 1));
      const int64_t n = uniform(0, static_cast<int64_t>(it->second.chain.size()));
      ASSERT_TRUE(kv->CommitBlocks(it->first, absl::MakeConstSpan(it->second.chain).first(n)).ok());
      ++commits;
    } else if (kind < 99) {  // finish or preempt
      auto it = live.begin();
      std::advance(it, uniform(0, static_cast<int64_t>(live.size()) - 1));
      ASSERT_TRUE(kv->Free(it->first).ok());
      live.erase(it);
      ++frees;
    } else {
      kv->ResetPrefixCache();
    }

    ASSERT_NO_FATAL_FAILURE(CheckModel(*kv, live, events, hook_calls, op));
  }
  // The mix must actually exercise the interesting paths.
  EXPECT_GT(hits, 100);
  EXPECT_GT(alloc_failures, 10);
  EXPECT_GT(kv->Stats().evictions, 100);
  EXPECT_GT(appends + commits + frees, 2000);
  EXPECT_GE(kv->Stats().allocation_failures, alloc_failures);
  std::cout << "random ops: allocs=" << allocs << " failures=" << alloc_failures << " hits=" << hits
            << " evictions=" << kv->Stats().evictions << "\n";
}

}  // namespace
}  // namespace pd::kvcache
