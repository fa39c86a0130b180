#include "services/router/kv_index.h"

#include <algorithm>
#include <atomic>
#include <ostream>
#include <string>
#include <thread>
#include <vector>

#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pd::router {
namespace {

using pdserve::internal::v1::KvEvent;
using pdserve::internal::v1::KvEventBatch;
using pdserve::internal::v1::Tier;
using pdserve::internal::v1::TIER_DRAM;
using pdserve::internal::v1::TIER_HBM;
using pdserve::internal::v1::TIER_NVME;
using pdserve::internal::v1::TIER_UNSPECIFIED;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::UnorderedElementsAre;

// Block i of chain `chain` (distinct chains never share hashes).
BlockHash H(uint64_t chain, uint64_t i) { return BlockHash{chain * 0x9e3779b97f4a7c15ULL + 1, i}; }

std::vector<BlockHash> Chain(uint64_t chain, int begin, int end) {
  std::vector<BlockHash> out;
  for (int i = begin; i < end; ++i) {
    out.push_back(H(chain, i));
  }
  return out;
}

std::string Bytes(const std::vector<BlockHash>& hashes) { return ConcatBlockHashes(hashes); }

KvEvent Stored(const std::vector<BlockHash>& hashes, Tier tier) {
  KvEvent e;
  e.mutable_stored()->set_block_hashes(Bytes(hashes));
  e.mutable_stored()->set_tier(tier);
  return e;
}

KvEvent Removed(const std::vector<BlockHash>& hashes, Tier tier) {
  KvEvent e;
  e.mutable_removed()->set_block_hashes(Bytes(hashes));
  e.mutable_removed()->set_tier(tier);
  return e;
}

KvEvent Cleared() {
  KvEvent e;
  e.mutable_cleared();
  return e;
}

KvEventBatch Batch(std::vector<KvEvent> events) {
  KvEventBatch b;
  uint64_t seq = 1;
  for (KvEvent& e : events) {
    e.set_sequence(seq++);
    *b.add_events() = std::move(e);
  }
  return b;
}

// One snapshot chunk holding `runs` (each stored in its tier).
KvEventBatch SnapshotChunk(uint64_t epoch, uint64_t sequence, bool complete,
                           const std::vector<std::pair<std::vector<BlockHash>, Tier>>& runs) {
  KvEventBatch b;
  b.set_epoch(epoch);
  b.mutable_snapshot()->set_sequence(sequence);
  b.mutable_snapshot()->set_complete(complete);
  for (const auto& [hashes, tier] : runs) {
    auto* run = b.mutable_snapshot()->add_blocks();
    run->set_block_hashes(Bytes(hashes));
    run->set_tier(tier);
  }
  return b;
}

WorkerOverlap Overlap(std::string id, int64_t hbm, int64_t dram = 0, int64_t nvme = 0) {
  return WorkerOverlap{std::move(id), hbm, dram, nvme};
}

}  // namespace

// For readable failures (found by ADL).
void PrintTo(const WorkerOverlap& o, std::ostream* os) {
  *os << "{" << o.worker_id << " hbm=" << o.hbm_blocks << " dram=" << o.dram_blocks
      << " nvme=" << o.nvme_blocks << "}";
}

namespace {

MATCHER_P(OverlapIs, expected, "") {
  return arg.worker_id == expected.worker_id && arg.hbm_blocks == expected.hbm_blocks &&
         arg.dram_blocks == expected.dram_blocks && arg.nvme_blocks == expected.nvme_blocks;
}

std::unique_ptr<KvIndex> NewIndex(int64_t max_blocks = 4'000'000) {
  absl::StatusOr<std::unique_ptr<KvIndex>> index = KvIndex::Create(KvIndexConfig{max_blocks});
  EXPECT_TRUE(index.ok()) << index.status();
  return *std::move(index);
}

TEST(KvIndexConfigTest, RejectsNonPositiveBound) {
  EXPECT_TRUE(KvIndexConfig{}.Validate().ok());
  absl::Status status = KvIndexConfig{0}.Validate();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("max_blocks"));
  EXPECT_FALSE(KvIndex::Create(KvIndexConfig{-1}).ok());
}

TEST(KvIndexTest, EmptyIndexAndEmptyChainMatchNothing) {
  auto index = NewIndex();
  EXPECT_THAT(index->Match(Chain(1, 0, 4)), IsEmpty());
  ASSERT_TRUE(index->Apply("w0", Batch({Stored(Chain(1, 0, 4), TIER_HBM)})).ok());
  EXPECT_THAT(index->Match({}), IsEmpty());
}

TEST(KvIndexTest, StoredBlocksMatchAsLeadingHbmBlocks) {
  auto index = NewIndex();
  ASSERT_TRUE(index->Apply("w0", Batch({Stored(Chain(1, 0, 4), TIER_HBM)})).ok());
  EXPECT_THAT(index->Match(Chain(1, 0, 4)), ElementsAre(OverlapIs(Overlap("w0", 4))));
  // A longer prompt: the match stops where the index does.
  EXPECT_THAT(index->Match(Chain(1, 0, 10)), ElementsAre(OverlapIs(Overlap("w0", 4))));
  // Another chain: no match.
  EXPECT_THAT(index->Match(Chain(2, 0, 4)), IsEmpty());
  KvIndexStats stats = index->Stats();
  EXPECT_EQ(stats.entries, 4);
  EXPECT_EQ(stats.blocks, 4);
  EXPECT_EQ(stats.workers, 1);
  EXPECT_EQ(stats.events_applied, 1);
}

TEST(KvIndexTest, MatchStopsAtFirstMiss) {
  auto index = NewIndex();
  std::vector<BlockHash> chain = Chain(1, 0, 6);
  ASSERT_TRUE(
      index->Apply("w0", Batch({Stored({chain[0], chain[1], chain[3], chain[4]}, TIER_HBM)})).ok());
  EXPECT_THAT(index->Match(chain), ElementsAre(OverlapIs(Overlap("w0", 2))));
}

TEST(KvIndexTest, WorkersSharingAPrefixGetTheirOwnOverlap) {
  auto index = NewIndex();
  ASSERT_TRUE(index->Apply("a", Batch({Stored(Chain(1, 0, 8), TIER_HBM)})).ok());
  ASSERT_TRUE(index->Apply("b", Batch({Stored(Chain(1, 0, 3), TIER_HBM)})).ok());
  ASSERT_TRUE(index->Apply("c", Batch({Stored(Chain(1, 1, 8), TIER_HBM)})).ok());  // no block 0
  EXPECT_THAT(index->Match(Chain(1, 0, 8)),
              UnorderedElementsAre(OverlapIs(Overlap("a", 8)), OverlapIs(Overlap("b", 3))));
  EXPECT_EQ(index->Stats().entries, 8 + 3 + 7);
  EXPECT_EQ(index->Stats().blocks, 8);
}

TEST(KvIndexTest, RemovedErasesOnlyThatTier) {
  auto index = NewIndex();
  std::vector<BlockHash> chain = Chain(1, 0, 4);
  ASSERT_TRUE(index
                  ->Apply("w0", Batch({Stored(chain, TIER_HBM), Stored(chain, TIER_DRAM),
                                       Removed({chain[2]}, TIER_HBM)}))
                  .ok());
  // Block 2 left HBM but is still in DRAM: the HBM prefix is 2, then DRAM continues.
  EXPECT_THAT(index->Match(chain), ElementsAre(OverlapIs(Overlap("w0", 2, 2))));
  EXPECT_EQ(index->Stats().entries, 7);
  ASSERT_TRUE(index->Apply("w0", Batch({Removed(chain, TIER_DRAM)})).ok());
  EXPECT_THAT(index->Match(chain), ElementsAre(OverlapIs(Overlap("w0", 2))));
  EXPECT_EQ(index->Stats().entries, 3);
  // Removing what is not there is a no-op.
  ASSERT_TRUE(
      index->Apply("w0", Batch({Removed(Chain(5, 0, 3), TIER_HBM), Removed({chain[0]}, TIER_NVME)}))
          .ok());
  EXPECT_EQ(index->Stats().entries, 3);
  ASSERT_TRUE(index->Apply("w0", Batch({Removed({chain[0]}, TIER_HBM)})).ok());
  EXPECT_THAT(index->Match(chain), IsEmpty());
  EXPECT_EQ(index->Stats().blocks, 2);
}

TEST(KvIndexTest, LowerTiersContinueAfterTheHbmPrefix) {
  auto index = NewIndex();
  std::vector<BlockHash> c = Chain(1, 0, 8);
  ASSERT_TRUE(index
                  ->Apply("w0", Batch({Stored({c[0], c[1]}, TIER_HBM),
                                       Stored({c[2], c[3]}, TIER_DRAM),  // c[3] also in NVMe
                                       Stored({c[3], c[4]}, TIER_NVME), Stored({c[5]}, TIER_DRAM),
                                       Stored({c[6]}, TIER_HBM)}))
                  .ok());
  // HBM 0-1; then 2, 3 (DRAM wins over NVMe), 5 in DRAM, 4 in NVMe; 6 is only in HBM and ends
  // the lower-tier continuation.
  EXPECT_THAT(index->Match(c), ElementsAre(OverlapIs(Overlap("w0", 2, 3, 1))));
  // A chain whose first block is only in a lower tier.
  ASSERT_TRUE(index->Apply("w1", Batch({Stored(Chain(2, 0, 3), TIER_NVME)})).ok());
  EXPECT_THAT(index->Match(Chain(2, 0, 3)), ElementsAre(OverlapIs(Overlap("w1", 0, 0, 3))));
}

TEST(KvIndexTest, ClearedDropsEverythingOfTheWorkerOnly) {
  auto index = NewIndex();
  ASSERT_TRUE(
      index
          ->Apply("a", Batch({Stored(Chain(1, 0, 4), TIER_HBM), Stored(Chain(2, 0, 4), TIER_DRAM)}))
          .ok());
  ASSERT_TRUE(index->Apply("b", Batch({Stored(Chain(1, 0, 2), TIER_HBM)})).ok());
  ASSERT_TRUE(index->Apply("a", Batch({Cleared(), Stored(Chain(3, 0, 1), TIER_HBM)})).ok());
  EXPECT_THAT(index->Match(Chain(1, 0, 4)), ElementsAre(OverlapIs(Overlap("b", 2))));
  EXPECT_THAT(index->Match(Chain(2, 0, 4)), IsEmpty());
  EXPECT_THAT(index->Match(Chain(3, 0, 1)), ElementsAre(OverlapIs(Overlap("a", 1))));
  EXPECT_EQ(index->Stats().entries, 3);
  EXPECT_EQ(index->Stats().workers, 2);
}

TEST(KvIndexTest, MultiChunkSnapshotReplacesTheWorkersState) {
  auto index = NewIndex();
  ASSERT_TRUE(index->Apply("a", Batch({Stored(Chain(1, 0, 4), TIER_HBM)})).ok());
  ASSERT_TRUE(index->Apply("b", Batch({Stored(Chain(1, 0, 4), TIER_HBM)})).ok());

  // First chunk: a's old blocks are gone, the chunk's are in.
  ASSERT_TRUE(index->Apply("a", SnapshotChunk(7, 40, false, {{Chain(2, 0, 3), TIER_HBM}})).ok());
  EXPECT_THAT(index->Match(Chain(1, 0, 4)), ElementsAre(OverlapIs(Overlap("b", 4))));
  EXPECT_THAT(index->Match(Chain(2, 0, 3)), ElementsAre(OverlapIs(Overlap("a", 3))));

  // Second chunk adds to the first (the set is the union of the chunks).
  ASSERT_TRUE(
      index
          ->Apply("a", SnapshotChunk(7, 40, false,
                                     {{Chain(2, 3, 5), TIER_HBM}, {Chain(2, 0, 2), TIER_DRAM}}))
          .ok());
  // Last chunk, with events after the snapshot.
  KvEventBatch last = SnapshotChunk(7, 40, true, {{Chain(3, 0, 2), TIER_NVME}});
  *last.add_events() = Stored(Chain(2, 5, 6), TIER_HBM);
  ASSERT_TRUE(index->Apply("a", last).ok());
  EXPECT_THAT(index->Match(Chain(2, 0, 8)), ElementsAre(OverlapIs(Overlap("a", 6))));
  EXPECT_THAT(index->Match(Chain(3, 0, 2)), ElementsAre(OverlapIs(Overlap("a", 0, 0, 2))));
  EXPECT_EQ(index->Stats().entries, 4 + 6 + 2 + 2);
  EXPECT_EQ(index->Stats().snapshot_chunks, 3);

  // Events resume normally once the snapshot is complete.
  ASSERT_TRUE(index->Apply("a", Batch({Removed(Chain(2, 0, 1), TIER_HBM)})).ok());
  EXPECT_THAT(index->Match(Chain(2, 0, 8)), ElementsAre(OverlapIs(Overlap("a", 0, 2))));

  // A later snapshot (one chunk) replaces everything again.
  ASSERT_TRUE(index->Apply("a", SnapshotChunk(7, 90, true, {})).ok());
  EXPECT_THAT(index->Match(Chain(2, 0, 8)), IsEmpty());
  EXPECT_EQ(index->Stats().entries, 4);
}

TEST(KvIndexTest, SnapshotWithOtherSequenceRestartsAnIncompleteOne) {
  auto index = NewIndex();
  ASSERT_TRUE(index->Apply("a", SnapshotChunk(7, 40, false, {{Chain(1, 0, 3), TIER_HBM}})).ok());
  // The stream broke and a new one started with a fresh snapshot: the partial one is dropped.
  ASSERT_TRUE(index->Apply("a", SnapshotChunk(7, 55, false, {{Chain(2, 0, 2), TIER_HBM}})).ok());
  EXPECT_THAT(index->Match(Chain(1, 0, 3)), IsEmpty());
  // Same for a new epoch (publisher restart) at the same sequence.
  ASSERT_TRUE(index->Apply("a", SnapshotChunk(8, 55, true, {{Chain(3, 0, 1), TIER_HBM}})).ok());
  EXPECT_THAT(index->Match(Chain(2, 0, 2)), IsEmpty());
  EXPECT_THAT(index->Match(Chain(3, 0, 1)), ElementsAre(OverlapIs(Overlap("a", 1))));
}

TEST(KvIndexTest, EventsWhileASnapshotIsIncompleteAreRefused) {
  auto index = NewIndex();
  ASSERT_TRUE(index->Apply("a", SnapshotChunk(7, 40, false, {{Chain(1, 0, 3), TIER_HBM}})).ok());
  absl::Status status = index->Apply("a", Batch({Stored(Chain(2, 0, 2), TIER_HBM)}));
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(status.message(), HasSubstr("a"));
  EXPECT_THAT(index->Match(Chain(2, 0, 2)), IsEmpty());
  // A heartbeat (empty batch) is fine; other workers are unaffected.
  EXPECT_TRUE(index->Apply("a", KvEventBatch()).ok());
  EXPECT_TRUE(index->Apply("b", Batch({Stored(Chain(2, 0, 2), TIER_HBM)})).ok());
  // RemoveWorker forgets the incomplete snapshot too.
  index->RemoveWorker("a");
  EXPECT_TRUE(index->Apply("a", Batch({Stored(Chain(3, 0, 2), TIER_HBM)})).ok());
  EXPECT_EQ(index->Stats().rejected_batches, 1);
}

TEST(KvIndexTest, LargeSnapshotAndRemoveWorkerCrossLockHolds) {
  // More blocks than one writer-lock hold covers, so the yielding path runs.
  auto index = NewIndex();
  std::vector<BlockHash> chain = Chain(1, 0, 3000);
  ASSERT_TRUE(index->Apply("a", SnapshotChunk(1, 1, true, {{chain, TIER_HBM}})).ok());
  ASSERT_TRUE(index->Apply("b", Batch({Stored(chain, TIER_DRAM)})).ok());
  EXPECT_THAT(index->Match(chain), UnorderedElementsAre(OverlapIs(Overlap("a", 3000)),
                                                        OverlapIs(Overlap("b", 0, 3000))));
  index->RemoveWorker("a");
  EXPECT_THAT(index->Match(chain), ElementsAre(OverlapIs(Overlap("b", 0, 3000))));
  KvIndexStats stats = index->Stats();
  EXPECT_EQ(stats.entries, 3000);
  EXPECT_EQ(stats.blocks, 3000);
  EXPECT_EQ(stats.workers, 1);
}

TEST(KvIndexTest, RemoveWorkerForgetsItAndReusesItsSlot) {
  auto index = NewIndex();
  ASSERT_TRUE(index->Apply("a", Batch({Stored(Chain(1, 0, 4), TIER_HBM)})).ok());
  ASSERT_TRUE(index->Apply("b", Batch({Stored(Chain(1, 0, 2), TIER_HBM)})).ok());
  index->RemoveWorker("a");
  index->RemoveWorker("a");        // again: no-op
  index->RemoveWorker("unknown");  // no-op
  EXPECT_THAT(index->Match(Chain(1, 0, 4)), ElementsAre(OverlapIs(Overlap("b", 2))));
  EXPECT_EQ(index->Stats().workers, 1);
  EXPECT_EQ(index->Stats().entries, 2);
  // A new worker takes the freed slot and starts empty.
  ASSERT_TRUE(index->Apply("c", Batch({Stored(Chain(2, 0, 1), TIER_HBM)})).ok());
  EXPECT_THAT(index->Match(Chain(1, 0, 4)), ElementsAre(OverlapIs(Overlap("b", 2))));
  EXPECT_THAT(index->Match(Chain(2, 0, 1)), ElementsAre(OverlapIs(Overlap("c", 1))));
}

TEST(KvIndexTest, BoundEvictsLeastRecentlyStoredChainTailsFirst) {
  auto index = NewIndex(/*max_blocks=*/10);
  ASSERT_TRUE(index->Apply("a", Batch({Stored(Chain(1, 0, 8), TIER_HBM)})).ok());
  ASSERT_TRUE(index->Apply("b", Batch({Stored(Chain(2, 0, 4), TIER_HBM)})).ok());
  // Two entries had to go: the tail of a's chain (a run is stored last block first, so its
  // prefix stays matchable).
  KvIndexStats stats = index->Stats();
  EXPECT_EQ(stats.entries, 10);
  EXPECT_EQ(stats.evictions, 2);
  EXPECT_THAT(index->Match(Chain(1, 0, 8)), ElementsAre(OverlapIs(Overlap("a", 6))));
  EXPECT_THAT(index->Match(Chain(2, 0, 4)), ElementsAre(OverlapIs(Overlap("b", 4))));

  // Storing again refreshes recency: a's prefix becomes the newest, b's chain the oldest.
  ASSERT_TRUE(index->Apply("a", Batch({Stored(Chain(1, 0, 6), TIER_HBM)})).ok());
  ASSERT_TRUE(index->Apply("c", Batch({Stored(Chain(3, 0, 3), TIER_HBM)})).ok());
  EXPECT_EQ(index->Stats().evictions, 5);
  EXPECT_THAT(index->Match(Chain(1, 0, 8)), ElementsAre(OverlapIs(Overlap("a", 6))));
  EXPECT_THAT(index->Match(Chain(2, 0, 4)), ElementsAre(OverlapIs(Overlap("b", 1))));
  EXPECT_THAT(index->Match(Chain(3, 0, 3)), ElementsAre(OverlapIs(Overlap("c", 3))));
  EXPECT_EQ(index->Stats().entries, 10);
}

TEST(KvIndexTest, RaisedBoundStopsEvictionsAndNeverLowers) {
  auto index = NewIndex(/*max_blocks=*/4);
  ASSERT_TRUE(index->Apply("a", Batch({Stored(Chain(1, 0, 6), TIER_HBM)})).ok());
  EXPECT_EQ(index->Stats().evictions, 2);
  EXPECT_EQ(index->Stats().max_blocks, 4);
  index->RaiseMaxBlocks(12);
  index->RaiseMaxBlocks(5);  // not a raise: ignored
  EXPECT_EQ(index->Stats().max_blocks, 12);
  ASSERT_TRUE(index->Apply("b", Batch({Stored(Chain(2, 0, 8), TIER_HBM)})).ok());
  EXPECT_EQ(index->Stats().evictions, 2);
  EXPECT_EQ(index->Stats().entries, 12);
  EXPECT_THAT(index->Match(Chain(2, 0, 8)), ElementsAre(OverlapIs(Overlap("b", 8))));
}

TEST(KvIndexTest, BoundNeverExceededUnderChurn) {
  auto index = NewIndex(/*max_blocks=*/500);
  absl::BitGen rng;
  for (int round = 0; round < 200; ++round) {
    const std::string worker = absl::StrCat("w", absl::Uniform(rng, 0, 5));
    const uint64_t chain = absl::Uniform<uint64_t>(rng, 0, 50);
    const int len = absl::Uniform(rng, 1, 40);
    const Tier tier = static_cast<Tier>(absl::Uniform(rng, 1, 4));
    KvEvent event = absl::Bernoulli(rng, 0.8) ? Stored(Chain(chain, 0, len), tier)
                                              : Removed(Chain(chain, 0, len), tier);
    ASSERT_TRUE(index->Apply(worker, Batch({event})).ok());
    ASSERT_LE(index->Stats().entries, 500);
  }
  EXPECT_GT(index->Stats().evictions, 0);
}

TEST(KvIndexTest, EvictionDropsAllTiersOfTheOldestPair) {
  auto index = NewIndex(/*max_blocks=*/3);
  std::vector<BlockHash> c = Chain(1, 0, 2);
  ASSERT_TRUE(index
                  ->Apply("a", Batch({Stored({c[0]}, TIER_HBM), Stored({c[0]}, TIER_DRAM),
                                      Stored({c[1]}, TIER_HBM), Stored({c[1]}, TIER_NVME)}))
                  .ok());
  // c[0] (HBM and DRAM) was the least recently stored pair when c[1]/NVMe needed room.
  EXPECT_EQ(index->Stats().evictions, 2);
  EXPECT_EQ(index->Stats().entries, 2);
  EXPECT_THAT(index->Match(c), IsEmpty());
  EXPECT_THAT(index->Match({c[1]}), ElementsAre(OverlapIs(Overlap("a", 1))));
}

struct BadBatchCase {
  std::string name;
  KvEventBatch batch;
  std::string worker = "w0";
  std::string message;  // substring of the error
};

std::vector<BadBatchCase> BadBatches() {
  std::vector<BadBatchCase> cases;
  const std::vector<BlockHash> good = Chain(9, 0, 2);
  auto with_good_first = [&](KvEvent bad) { return Batch({Stored(good, TIER_HBM), bad}); };
  {
    KvEvent e = Stored(good, TIER_HBM);
    e.mutable_stored()->mutable_block_hashes()->push_back('x');
    cases.push_back(
        {"stored_length", with_good_first(e), "w0", "events[1].stored.block_hashes has 33 bytes"});
  }
  {
    KvEvent e = Removed(good, TIER_HBM);
    e.mutable_removed()->mutable_block_hashes()->resize(15);
    cases.push_back({"removed_length", with_good_first(e), "w0",
                     "events[1].removed.block_hashes has 15 bytes"});
  }
  cases.push_back({"stored_tier_unspecified", with_good_first(Stored(good, TIER_UNSPECIFIED)), "w0",
                   "events[1].stored.tier is TIER_UNSPECIFIED"});
  cases.push_back({"removed_tier_unknown", with_good_first(Removed(good, static_cast<Tier>(9))),
                   "w0", "events[1].removed.tier is unknown (9)"});
  cases.push_back({"event_not_set", with_good_first(KvEvent()), "w0",
                   "events[1] has none of stored, removed, cleared set"});
  {
    KvEvent e = Stored(good, TIER_HBM);
    e.mutable_stored()->set_parent_hash("short");
    cases.push_back(
        {"parent_hash", with_good_first(e), "w0", "events[1].stored.parent_hash has 5 bytes"});
  }
  {
    KvEvent e = Stored(good, TIER_HBM);
    e.set_worker_id("other");
    cases.push_back({"event_worker", with_good_first(e), "w0", "events[1].worker_id is other"});
  }
  {
    KvEventBatch b = Batch({Stored(good, TIER_HBM)});
    b.set_worker_id("other");
    cases.push_back({"batch_worker", b, "w0", "batch.worker_id is other"});
  }
  cases.push_back({"empty_worker", Batch({Stored(good, TIER_HBM)}), "", "worker_id is empty"});
  {
    KvEventBatch b = SnapshotChunk(1, 1, true, {{good, TIER_HBM}, {good, TIER_UNSPECIFIED}});
    cases.push_back({"snapshot_tier", b, "w0", "snapshot.blocks[1].tier"});
  }
  {
    KvEventBatch b = SnapshotChunk(1, 1, false, {{good, TIER_HBM}});
    *b.add_events() = Stored(good, TIER_DRAM);
    cases.push_back({"events_in_incomplete_chunk", b, "w0", "snapshot.complete is false"});
  }
  return cases;
}

TEST(KvIndexTest, MalformedBatchesAreRejectedWholeWithTheFieldNamed) {
  for (const BadBatchCase& c : BadBatches()) {
    SCOPED_TRACE(c.name);
    auto index = NewIndex();
    ASSERT_TRUE(index->Apply("w0", Batch({Stored(Chain(1, 0, 2), TIER_HBM)})).ok());
    absl::Status status = index->Apply(c.worker, c.batch);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(status.message(), HasSubstr(c.message));
    if (!c.worker.empty()) {
      EXPECT_THAT(status.message(), HasSubstr(c.worker));
    }
    // Nothing of the batch applied, not even the valid event before the bad one.
    KvIndexStats stats = index->Stats();
    EXPECT_EQ(stats.entries, 2);
    EXPECT_EQ(stats.events_applied, 1);
    EXPECT_EQ(stats.rejected_batches, 1);
    EXPECT_THAT(index->Match(Chain(9, 0, 2)), IsEmpty());
    EXPECT_THAT(index->Match(Chain(1, 0, 2)), ElementsAre(OverlapIs(Overlap("w0", 2))));
  }
}

TEST(KvIndexTest, MatchingBatchWorkerIdsAreAccepted) {
  auto index = NewIndex();
  KvEventBatch b = Batch({Stored(Chain(1, 0, 2), TIER_HBM)});
  b.set_worker_id("w0");
  b.mutable_events(0)->set_worker_id("w0");
  b.mutable_events(0)->mutable_stored()->set_parent_hash(H(7, 7).ToBytes());
  EXPECT_TRUE(index->Apply("w0", b).ok());
}

// Readers match while writers apply stored/removed/cleared/snapshots for their own workers and
// a remover drops and re-adds workers. Checked here for crashes and for the final state; run
// under TSan (PD_SANITIZE=thread) for races.
TEST(KvIndexTest, ConcurrentReadersAndWriters) {
  auto index = NewIndex(/*max_blocks=*/20'000);
  constexpr int kWriters = 4;
  constexpr int kReaders = 2;
  constexpr int kRounds = 150;
  std::atomic<bool> done{false};
  std::atomic<int64_t> matches{0};

  std::vector<std::thread> threads;
  for (int w = 0; w < kWriters; ++w) {
    threads.emplace_back([&, w] {
      absl::BitGen rng;
      const std::string id = absl::StrCat("w", w);
      for (int round = 0; round < kRounds; ++round) {
        const uint64_t chain = absl::Uniform<uint64_t>(rng, 0, 20);
        const int len = absl::Uniform(rng, 1, 64);
        const int op = absl::Uniform(rng, 0, 20);
        absl::Status status;
        if (op == 0) {
          status = index->Apply(id, Batch({Cleared()}));
        } else if (op == 1) {
          status =
              index->Apply(id, SnapshotChunk(1, round, false, {{Chain(chain, 0, len), TIER_HBM}}));
          if (status.ok()) {
            status = index->Apply(
                id, SnapshotChunk(1, round, true, {{Chain(chain, 0, len), TIER_DRAM}}));
          }
        } else if (op < 6) {
          status = index->Apply(id, Batch({Removed(Chain(chain, 0, len), TIER_HBM)}));
        } else {
          status = index->Apply(id, Batch({Stored(Chain(chain, 0, len), TIER_HBM)}));
        }
        ASSERT_TRUE(status.ok()) << status;
      }
    });
  }
  // A worker that comes and goes; its own thread orders Apply and RemoveWorker.
  threads.emplace_back([&] {
    for (int round = 0; round < kRounds; ++round) {
      ASSERT_TRUE(index->Apply("flaky", Batch({Stored(Chain(round % 20, 0, 300), TIER_HBM)})).ok());
      index->RemoveWorker("flaky");
    }
  });
  for (int r = 0; r < kReaders; ++r) {
    threads.emplace_back([&] {
      absl::BitGen rng;
      while (!done.load()) {
        const uint64_t chain = absl::Uniform<uint64_t>(rng, 0, 20);
        for (const WorkerOverlap& o : index->Match(Chain(chain, 0, 64))) {
          ASSERT_GT(o.total_blocks(), 0);
          ASSERT_LE(o.total_blocks(), 64);
        }
        ASSERT_LE(index->Stats().entries, 20'000);
        ++matches;
      }
    });
  }
  for (int i = 0; i < kWriters + 1; ++i) {
    threads[i].join();
  }
  done = true;
  for (size_t i = kWriters + 1; i < threads.size(); ++i) {
    threads[i].join();
  }
  EXPECT_GT(matches.load(), 0);

  // Deterministic end state: one snapshot per writer, then exact matches.
  for (int w = 0; w < kWriters; ++w) {
    ASSERT_TRUE(index
                    ->Apply(absl::StrCat("w", w),
                            SnapshotChunk(2, 1, true, {{Chain(100 + w, 0, 5 + w), TIER_HBM}}))
                    .ok());
  }
  for (int w = 0; w < kWriters; ++w) {
    EXPECT_THAT(index->Match(Chain(100 + w, 0, 32)),
                ElementsAre(OverlapIs(Overlap(absl::StrCat("w", w), 5 + w))));
  }
  KvIndexStats stats = index->Stats();
  EXPECT_EQ(stats.entries, 5 + 6 + 7 + 8);
  EXPECT_EQ(stats.workers, kWriters);
}

}  // namespace
}  // namespace pd::router
