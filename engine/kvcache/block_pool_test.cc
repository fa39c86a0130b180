#include "engine/kvcache/block_pool.h"

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/kvcache/recording_kv_event_listener.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pd::kvcache {
namespace {

using ::testing::ElementsAre;
using Kind = RecordingKvEventListener::Event::Kind;

BlockHash H(uint64_t n) { return BlockHash{.high = 0xabc, .low = n}; }
BlockId B(uint32_t n) { return BlockId(n); }

std::vector<BlockId> MustAllocate(BlockPool& pool, int64_t n) {
  std::vector<BlockId> out;
  const absl::Status s = pool.Allocate(n, &out);
  EXPECT_TRUE(s.ok()) << s;
  return out;
}

TEST(BlockPoolTest, FreshPoolHandsOutBlocksInIdOrder) {
  BlockPool pool(4, nullptr, nullptr);
  EXPECT_EQ(pool.NumFreeBlocks(), 4);
  EXPECT_THAT(MustAllocate(pool, 3), ElementsAre(B(0), B(1), B(2)));
  EXPECT_EQ(pool.NumUsedBlocks(), 3);
  EXPECT_EQ(pool.ref_count(B(1)), 1);
  EXPECT_FALSE(pool.hash(B(1)).has_value());
  EXPECT_TRUE(pool.CheckInvariants().ok());
}

TEST(BlockPoolTest, AllocateIsAllOrNothing) {
  BlockPool pool(3, nullptr, nullptr);
  std::vector<BlockId> out = MustAllocate(pool, 2);
  const absl::Status s = pool.Allocate(2, &out);
  EXPECT_TRUE(absl::IsResourceExhausted(s)) << s;
  EXPECT_EQ(out.size(), 2u);
  EXPECT_EQ(pool.NumFreeBlocks(), 1);
  EXPECT_TRUE(absl::IsInvalidArgument(pool.Allocate(-1, &out)));
  EXPECT_TRUE(pool.CheckInvariants().ok());
}

TEST(BlockPoolTest, ReleaseSendsHashedBlocksToLruAndOthersToFreeList) {
  RecordingKvEventListener events;
  BlockPool pool(4, &events, nullptr);
  std::vector<BlockId> b = MustAllocate(pool, 3);
  ASSERT_TRUE(pool.Commit({b[0], b[1]}, {H(0), H(1)}, std::nullopt).ok());
  pool.Release(b[2]);  // unhashed
  pool.Release(b[1]);
  pool.Release(b[0]);
  EXPECT_EQ(pool.NumUnhashedFreeBlocks(), 2);
  EXPECT_EQ(pool.NumEvictableBlocks(), 2);
  EXPECT_THAT(pool.EvictableBlocksInLruOrder(), ElementsAre(b[1], b[0]));
  EXPECT_EQ(pool.Lookup(H(0)), b[0]);
  EXPECT_EQ(pool.MatchPrefix({H(0), H(1), H(2)}), 2);
  EXPECT_TRUE(pool.CheckInvariants().ok());
}

TEST(BlockPoolTest, EvictsLeastRecentlyReleasedAfterFreeBlocksCallingHookFirst) {
  RecordingKvEventListener events;
  std::vector<std::string> log;
  BlockPool* pool_ptr = nullptr;
  BlockPool pool(4, &events, [&](const BlockHash& hash, BlockId block) {
    // Before reuse: the block still maps to its hash and is not handed out yet.
    EXPECT_EQ(pool_ptr->Lookup(hash), block);
    EXPECT_EQ(pool_ptr->ref_count(block), 0);
    log.push_back(
        absl::StrCat("hook ", hash.low, "@", block.value(), " events=", events.events().size()));
  });
  pool_ptr = &pool;
  std::vector<BlockId> b = MustAllocate(pool, 4);
  ASSERT_TRUE(pool.Commit({b[0], b[1], b[2]}, {H(10), H(11), H(12)}, std::nullopt).ok());
  events.Clear();
  // Release order defines recency: 1 (oldest), 0, 2; block 3 is unhashed.
  pool.Release(b[1]);
  pool.Release(b[3]);
  pool.Release(b[0]);
  pool.Release(b[2]);
  EXPECT_THAT(pool.EvictableBlocksInLruOrder(), ElementsAre(b[1], b[0], b[2]));

  // The free block goes first, then the LRU front: block 1, then block 0.
  EXPECT_THAT(MustAllocate(pool, 3), ElementsAre(b[3], b[1], b[0]));
  EXPECT_THAT(log, ElementsAre("hook 11@1 events=0", "hook 10@0 events=0"));
  ASSERT_EQ(events.events().size(), 1u);
  EXPECT_EQ(events.events()[0].kind, Kind::kRemoved);
  EXPECT_THAT(events.events()[0].hashes, ElementsAre(H(11), H(10)));
  EXPECT_EQ(pool.Lookup(H(11)), BlockId::Invalid());
  EXPECT_EQ(pool.Lookup(H(12)), b[2]);
  EXPECT_EQ(pool.num_evictions(), 2);
  EXPECT_TRUE(pool.CheckInvariants().ok());
}

TEST(BlockPoolTest, AcquireCachedTakesBlockOffTheLru) {
  BlockPool pool(2, nullptr, nullptr);
  std::vector<BlockId> b = MustAllocate(pool, 2);
  ASSERT_TRUE(pool.Commit({b[0]}, {H(1)}, std::nullopt).ok());
  pool.Release(b[0]);
  EXPECT_TRUE(pool.IsEvictable(b[0]));
  EXPECT_EQ(pool.NumFreeBlocks(), 1);
  pool.AcquireCached(b[0]);
  pool.AcquireCached(b[0]);
  EXPECT_FALSE(pool.IsEvictable(b[0]));
  EXPECT_EQ(pool.ref_count(b[0]), 2);
  EXPECT_EQ(pool.NumFreeBlocks(), 0);
  std::vector<BlockId> out;
  EXPECT_TRUE(absl::IsResourceExhausted(pool.Allocate(1, &out)));
  EXPECT_TRUE(pool.CheckInvariants().ok());
}

TEST(BlockPoolTest, CommitKeepsExistingMappingForDuplicatesAndReportsRuns) {
  RecordingKvEventListener events;
  BlockPool pool(8, &events, nullptr);
  std::vector<BlockId> a = MustAllocate(pool, 2);
  ASSERT_TRUE(pool.Commit({a[1]}, {H(2)}, H(1)).ok());
  std::vector<BlockId> b = MustAllocate(pool, 4);
  // H(2) is already held by a[1]: b[1] becomes a duplicate; two runs are reported.
  ASSERT_TRUE(pool.Commit(b, {H(1), H(2), H(3), H(4)}, std::nullopt).ok());
  EXPECT_EQ(pool.Lookup(H(2)), a[1]);
  EXPECT_FALSE(pool.hash(b[1]).has_value());
  ASSERT_EQ(events.events().size(), 3u);
  EXPECT_THAT(events.events()[0].hashes, ElementsAre(H(2)));
  EXPECT_EQ(events.events()[0].parent, H(1));
  EXPECT_THAT(events.events()[1].hashes, ElementsAre(H(1)));
  EXPECT_EQ(events.events()[1].parent, std::nullopt);
  EXPECT_THAT(events.events()[2].hashes, ElementsAre(H(3), H(4)));
  EXPECT_EQ(events.events()[2].parent, H(2));

  // Re-committing the same hashes changes nothing and reports nothing.
  ASSERT_TRUE(pool.Commit(b, {H(1), H(2), H(3), H(4)}, std::nullopt).ok());
  EXPECT_EQ(events.events().size(), 3u);
  // The duplicate goes to the free list, not the LRU.
  pool.Release(b[1]);
  EXPECT_EQ(pool.NumEvictableBlocks(), 0);
  EXPECT_TRUE(pool.CheckInvariants().ok());
}

TEST(BlockPoolTest, StoreHookSeesEachNewlyRegisteredBlockOnceAfterTheListener) {
  RecordingKvEventListener events;
  std::vector<std::pair<BlockHash, BlockId>> stored;
  size_t events_seen_at_first_call = 0;
  BlockPool pool(8, &events, nullptr, [&](const BlockHash& hash, BlockId block) {
    if (stored.empty()) events_seen_at_first_call = events.events().size();
    stored.emplace_back(hash, block);
  });
  std::vector<BlockId> a = MustAllocate(pool, 2);
  ASSERT_TRUE(pool.Commit({a[1]}, {H(2)}, H(1)).ok());
  EXPECT_EQ(events_seen_at_first_call, 1u) << "the listener hears of a block first";
  std::vector<BlockId> b = MustAllocate(pool, 3);
  // H(2) is a duplicate (held by a[1]): only H(1) and H(3) are new.
  ASSERT_TRUE(pool.Commit(b, {H(1), H(2), H(3)}, std::nullopt).ok());
  // Re-committing registers nothing new.
  ASSERT_TRUE(pool.Commit(b, {H(1), H(2), H(3)}, std::nullopt).ok());
  ASSERT_EQ(stored.size(), 3u);
  EXPECT_EQ(stored[0], std::make_pair(H(2), a[1]));
  EXPECT_EQ(stored[1], std::make_pair(H(1), b[0]));
  EXPECT_EQ(stored[2], std::make_pair(H(3), b[2]));
  EXPECT_TRUE(pool.CheckInvariants().ok());
}

TEST(BlockPoolTest, CommitFailuresChangeNothing) {
  RecordingKvEventListener events;
  BlockPool pool(4, &events, nullptr);
  std::vector<BlockId> b = MustAllocate(pool, 2);
  ASSERT_TRUE(pool.Commit({b[0]}, {H(1)}, std::nullopt).ok());
  events.Clear();
  EXPECT_TRUE(absl::IsFailedPrecondition(pool.Commit({b[1], b[0]}, {H(5), H(6)}, std::nullopt)));
  EXPECT_TRUE(absl::IsFailedPrecondition(pool.Commit({b[1], B(3)}, {H(5), H(6)}, std::nullopt)));
  EXPECT_TRUE(absl::IsFailedPrecondition(pool.Commit({B(99)}, {H(5)}, std::nullopt)));
  EXPECT_TRUE(absl::IsInvalidArgument(pool.Commit({b[1]}, {}, std::nullopt)));
  EXPECT_FALSE(pool.hash(b[1]).has_value());
  EXPECT_EQ(pool.Lookup(H(5)), BlockId::Invalid());
  EXPECT_TRUE(events.events().empty());
}

TEST(BlockPoolTest, ResetPrefixCacheDropsEveryHash) {
  RecordingKvEventListener events;
  int hook_calls = 0;
  BlockPool pool(3, &events, [&](const BlockHash&, BlockId) { ++hook_calls; });
  std::vector<BlockId> b = MustAllocate(pool, 2);
  ASSERT_TRUE(pool.Commit(b, {H(1), H(2)}, std::nullopt).ok());
  pool.Release(b[1]);
  pool.ResetPrefixCache();
  EXPECT_EQ(pool.NumCachedHashes(), 0);
  EXPECT_EQ(pool.NumEvictableBlocks(), 0);
  EXPECT_EQ(pool.NumUnhashedFreeBlocks(), 2);
  EXPECT_EQ(pool.ref_count(b[0]), 1);
  EXPECT_EQ(events.events().back().kind, Kind::kAllCleared);
  EXPECT_TRUE(events.Replay().empty());
  pool.Release(b[0]);
  EXPECT_EQ(pool.NumUnhashedFreeBlocks(), 3);
  EXPECT_EQ(hook_calls, 0);
  EXPECT_TRUE(pool.CheckInvariants().ok());
}

TEST(BlockPoolDeathTest, ReleasingAFreeBlockIsAProgrammingError) {
  BlockPool pool(1, nullptr, nullptr);
  EXPECT_DEATH(pool.Release(B(0)), "released more often");
}

}  // namespace
}  // namespace pd::kvcache
