#include "services/kv_events/kv_event_log.h"

#include <algorithm>
#include <optional>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/random/random.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "services/kv_events/kv_event_publisher.h"

namespace pd::kv_events {
namespace {

namespace iv1 = pdserve::internal::v1;
using ::testing::ElementsAre;
using ::testing::SizeIs;

constexpr uint64_t kEpoch = 77;

BlockHash H(uint64_t i) { return BlockHash{0xabc0000000000000ULL + i, i * 31 + 7}; }

std::vector<BlockHash> Decode(absl::string_view bytes) {
  EXPECT_EQ(bytes.size() % 16, 0u);
  absl::StatusOr<std::vector<BlockHash>> out = SplitBlockHashes(bytes);
  EXPECT_TRUE(out.ok()) << out.status();
  return out.ok() ? *std::move(out) : std::vector<BlockHash>();
}

std::optional<BlockHash> DecodeParent(absl::string_view bytes) {
  if (bytes.empty()) {
    return std::nullopt;
  }
  std::vector<BlockHash> h = Decode(bytes);
  EXPECT_THAT(h, SizeIs(1));
  return h.empty() ? std::nullopt : std::optional<BlockHash>(h[0]);
}

using HeldMap = absl::flat_hash_map<BlockHash, std::optional<BlockHash>>;

HeldMap ToMap(const std::vector<HeldBlock>& blocks) {
  HeldMap m;
  for (const HeldBlock& b : blocks) {
    EXPECT_TRUE(m.emplace(b.hash, b.parent).second) << "duplicate " << b.hash.ToHex();
  }
  return m;
}

// Folds a stream's batches the way a subscriber's consumer does: hash -> parent.
void Fold(const iv1::KvEventBatch& batch, bool first_chunk, HeldMap* held) {
  if (batch.has_snapshot()) {
    if (first_chunk) {
      held->clear();
    }
    for (const iv1::BlockStored& run : batch.snapshot().blocks()) {
      EXPECT_EQ(run.tier(), iv1::TIER_HBM);
      std::optional<BlockHash> parent = DecodeParent(run.parent_hash());
      for (const BlockHash& h : Decode(run.block_hashes())) {
        EXPECT_TRUE(held->emplace(h, parent).second) << "block twice in a snapshot";
        parent = h;
      }
    }
  }
  for (const iv1::KvEvent& e : batch.events()) {
    if (e.has_stored()) {
      std::optional<BlockHash> parent = DecodeParent(e.stored().parent_hash());
      for (const BlockHash& h : Decode(e.stored().block_hashes())) {
        (*held)[h] = parent;
        parent = h;
      }
    } else if (e.has_removed()) {
      for (const BlockHash& h : Decode(e.removed().block_hashes())) {
        held->erase(h);
      }
    } else {
      EXPECT_TRUE(e.has_cleared());
      held->clear();
    }
  }
}

std::vector<BlockHash> Chain(uint64_t first, int n) {
  std::vector<BlockHash> c;
  for (int i = 0; i < n; ++i) {
    c.push_back(H(first + static_cast<uint64_t>(i)));
  }
  return c;
}

TEST(KvEventLogTest, NumbersEventsAndTracksTheHeldSet) {
  KvEventLog log(kEpoch, {});
  EXPECT_EQ(log.last_sequence(), 0u);
  EXPECT_EQ(log.first_retained_sequence(), 1u);
  const std::vector<BlockHash> a = Chain(0, 4);
  EXPECT_EQ(log.Stored(a, std::nullopt), 1);
  EXPECT_EQ(log.Stored(Chain(4, 2), a.back()), 1);
  EXPECT_EQ(log.Removed({a[1], H(99)}), 1);  // unknown hashes are recorded, not an error
  EXPECT_EQ(log.last_sequence(), 3u);
  EXPECT_EQ(log.num_held(), 5);
  HeldMap held = ToMap(log.HeldBlocks());
  EXPECT_EQ(held.at(H(4)), a.back());
  EXPECT_EQ(held.at(H(0)), std::nullopt);
  EXPECT_FALSE(held.contains(a[1]));
  EXPECT_EQ(log.Cleared(), 1);
  EXPECT_EQ(log.num_held(), 0);
  EXPECT_EQ(log.last_sequence(), 4u);

  google::protobuf::RepeatedPtrField<iv1::KvEvent> events;
  absl::StatusOr<int> n = log.CopyEvents(0, 100, 1 << 20, "w1", &events);
  ASSERT_TRUE(n.ok()) << n.status();
  ASSERT_EQ(*n, 4);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(events[i].sequence(), static_cast<uint64_t>(i + 1));
    EXPECT_EQ(events[i].worker_id(), "w1");
  }
  EXPECT_THAT(Decode(events[0].stored().block_hashes()), ::testing::ElementsAreArray(a));
  EXPECT_TRUE(events[0].stored().parent_hash().empty());
  EXPECT_EQ(events[0].stored().tier(), iv1::TIER_HBM);
  EXPECT_EQ(DecodeParent(events[1].stored().parent_hash()), a.back());
  EXPECT_THAT(Decode(events[2].removed().block_hashes()), ElementsAre(a[1], H(99)));
  EXPECT_EQ(events[2].removed().tier(), iv1::TIER_HBM);
  EXPECT_TRUE(events[3].has_cleared());
}

TEST(KvEventLogTest, EmptyCallsRecordNothing) {
  KvEventLog log(kEpoch, {});
  EXPECT_EQ(log.Stored({}, std::nullopt), 0);
  EXPECT_EQ(log.Removed({}), 0);
  EXPECT_EQ(log.last_sequence(), 0u);
}

TEST(KvEventLogTest, LongStoredRunsBecomeChainedEvents) {
  KvEventLogConfig config;
  config.block_size = 16;
  KvEventLog log(kEpoch, config);
  const std::vector<BlockHash> chain = Chain(1000, kMaxHashesPerEvent + 5);
  EXPECT_EQ(log.Stored(chain, H(1)), 2);
  google::protobuf::RepeatedPtrField<iv1::KvEvent> events;
  ASSERT_TRUE(log.CopyEvents(0, 10, 64 << 20, "w", &events).ok());
  ASSERT_THAT(events, SizeIs(2));
  EXPECT_EQ(DecodeParent(events[0].stored().parent_hash()), H(1));
  EXPECT_EQ(Decode(events[0].stored().block_hashes()).size(),
            static_cast<size_t>(kMaxHashesPerEvent));
  EXPECT_EQ(events[0].stored().num_tokens(), static_cast<uint32_t>(kMaxHashesPerEvent * 16));
  EXPECT_EQ(DecodeParent(events[1].stored().parent_hash()), chain[kMaxHashesPerEvent - 1]);
  EXPECT_THAT(Decode(events[1].stored().block_hashes()), SizeIs(5));
  EXPECT_EQ(events[1].stored().num_tokens(), 5u * 16);
  EXPECT_EQ(ToMap(log.HeldBlocks()).at(chain[kMaxHashesPerEvent]), chain[kMaxHashesPerEvent - 1]);
}

TEST(KvEventLogTest, ResumeReplaysWhatTheHistoryHoldsAndSnapshotsOtherwise) {
  KvEventLogConfig config;
  config.history_events = 3;
  KvEventLog log(kEpoch, config);
  // Before any event: from 0 is a snapshot at 0; anything else is ahead of the publisher.
  EXPECT_EQ(log.Resume(kEpoch, 0).reason, iv1::SNAPSHOT_REASON_REQUESTED);
  EXPECT_EQ(log.Resume(kEpoch, 1).reason, iv1::SNAPSHOT_REASON_EPOCH_CHANGED);
  for (int i = 0; i < 10; ++i) {
    log.Stored({H(static_cast<uint64_t>(i))}, std::nullopt);
  }
  EXPECT_EQ(log.first_retained_sequence(), 8u);
  EXPECT_EQ(log.num_history_events(), 3);

  StreamStart s = log.Resume(kEpoch, 0);
  EXPECT_EQ(s.reason, iv1::SNAPSHOT_REASON_REQUESTED);
  EXPECT_EQ(s.sequence, 10u);
  s = log.Resume(kEpoch + 1, 9);
  EXPECT_EQ(s.reason, iv1::SNAPSHOT_REASON_EPOCH_CHANGED);
  EXPECT_EQ(s.sequence, 10u);
  EXPECT_EQ(log.Resume(0, 9).reason, iv1::SNAPSHOT_REASON_EPOCH_CHANGED);
  EXPECT_EQ(log.Resume(kEpoch, 11).reason, iv1::SNAPSHOT_REASON_EPOCH_CHANGED);
  s = log.Resume(kEpoch, 6);
  EXPECT_EQ(s.reason, iv1::SNAPSHOT_REASON_HISTORY_TRUNCATED);
  EXPECT_EQ(s.sequence, 10u);
  for (uint64_t from : {7u, 8u, 9u, 10u}) {
    s = log.Resume(kEpoch, from);
    EXPECT_TRUE(s.replay()) << from;
    EXPECT_EQ(s.sequence, from);
  }
}

TEST(KvEventLogTest, HistoryIsBoundedByBytesButKeepsTheNewestEvent) {
  KvEventLogConfig config;
  config.history_bytes = 1000;
  KvEventLog log(kEpoch, config);
  for (int i = 0; i < 20; ++i) {
    log.Stored(Chain(static_cast<uint64_t>(i) * 10, 10), std::nullopt);  // ~208 bytes each
  }
  EXPECT_LE(log.history_bytes(), 1000);
  EXPECT_GE(log.num_history_events(), 2);
  EXPECT_LT(log.num_history_events(), 20);
  EXPECT_EQ(log.first_retained_sequence() + log.num_history_events(), 21u);

  log.Stored(Chain(5000, 200), std::nullopt);  // alone above the bound
  EXPECT_EQ(log.num_history_events(), 1);
  EXPECT_EQ(log.first_retained_sequence(), 21u);
  EXPECT_TRUE(log.Resume(kEpoch, 20).replay());
}

TEST(KvEventLogTest, CopyEventsRespectsLimitsAndReportsFallingBehind) {
  KvEventLogConfig config;
  config.history_events = 50;
  KvEventLog log(kEpoch, config);
  for (int i = 0; i < 60; ++i) {
    log.Stored(Chain(static_cast<uint64_t>(i) * 100, 20), std::nullopt);  // 320 bytes of hashes
  }
  google::protobuf::RepeatedPtrField<iv1::KvEvent> events;
  absl::StatusOr<int> n = log.CopyEvents(20, 7, 1 << 20, "w", &events);
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_EQ(*n, 7);
  EXPECT_EQ(events[0].sequence(), 21u);
  EXPECT_EQ(events[6].sequence(), 27u);

  events.Clear();
  n = log.CopyEvents(20, 100, 1000, "w", &events);  // ~370 bytes each: two fit
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(*n, 2);
  events.Clear();
  n = log.CopyEvents(20, 100, 10, "w", &events);  // never less than one
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(*n, 1);

  events.Clear();
  n = log.CopyEvents(60, 100, 1 << 20, "w", &events);
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(*n, 0);

  EXPECT_EQ(log.CopyEvents(9, 10, 1 << 20, "w", &events).status().code(),
            absl::StatusCode::kOutOfRange);
  EXPECT_TRUE(log.CopyEvents(10, 10, 1 << 20, "w", &events).ok());  // event 11 is the oldest
  EXPECT_EQ(log.CopyEvents(61, 10, 1 << 20, "w", &events).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(KvEventLogTest, SnapshotCoalescesChainsIntoRuns) {
  KvEventLog log(kEpoch, {});
  const std::vector<BlockHash> a = Chain(0, 10);
  log.Stored(absl::MakeConstSpan(a).subspan(0, 4), std::nullopt);
  log.Stored(absl::MakeConstSpan(a).subspan(4), a[3]);
  log.Stored(Chain(100, 2), a[3]);      // a branch off a[3]
  log.Stored(Chain(200, 5), H(12345));  // parent not held
  log.Stored({H(300)}, std::nullopt);
  std::vector<iv1::KvEventBatch> chunks =
      BuildSnapshotBatches("w7", kEpoch, log.last_sequence(), iv1::SNAPSHOT_REASON_REQUESTED,
                           log.HeldBlocks(), /*block_size=*/16);
  ASSERT_THAT(chunks, SizeIs(1));
  const iv1::KvEventBatch& c = chunks[0];
  EXPECT_EQ(c.worker_id(), "w7");
  EXPECT_EQ(c.epoch(), kEpoch);
  EXPECT_EQ(c.snapshot().sequence(), 5u);
  EXPECT_EQ(c.snapshot().reason(), iv1::SNAPSHOT_REASON_REQUESTED);
  EXPECT_TRUE(c.snapshot().complete());
  EXPECT_TRUE(c.events().empty());
  // a[0..3] (a[3] has two children), a[4..9], the branch, the orphan chain, H(300).
  ASSERT_THAT(c.snapshot().blocks(), SizeIs(5));
  absl::flat_hash_map<BlockHash, std::vector<BlockHash>> runs_by_parent_of_first;
  for (const iv1::BlockStored& run : c.snapshot().blocks()) {
    const std::vector<BlockHash> hashes = Decode(run.block_hashes());
    EXPECT_EQ(run.num_tokens(), hashes.size() * 16);
    const std::optional<BlockHash> parent = DecodeParent(run.parent_hash());
    if (hashes.front() == a[0]) {
      EXPECT_THAT(hashes, ElementsAre(a[0], a[1], a[2], a[3]));
      EXPECT_EQ(parent, std::nullopt);
    } else if (hashes.front() == a[4]) {
      EXPECT_THAT(hashes, ::testing::ElementsAreArray(absl::MakeConstSpan(a).subspan(4)));
      EXPECT_EQ(parent, a[3]);
    } else if (hashes.front() == H(100)) {
      EXPECT_THAT(hashes, ElementsAre(H(100), H(101)));
      EXPECT_EQ(parent, a[3]);
    } else if (hashes.front() == H(200)) {
      EXPECT_THAT(hashes, ::testing::ElementsAreArray(Chain(200, 5)));
      EXPECT_EQ(parent, H(12345));
    } else {
      EXPECT_THAT(hashes, ElementsAre(H(300)));
      EXPECT_EQ(parent, std::nullopt);
    }
  }
  HeldMap folded;
  Fold(c, true, &folded);
  EXPECT_EQ(folded, ToMap(log.HeldBlocks()));
}

TEST(KvEventLogTest, EmptySnapshotIsOneCompleteChunk) {
  std::vector<iv1::KvEventBatch> chunks =
      BuildSnapshotBatches("w", kEpoch, 0, iv1::SNAPSHOT_REASON_EPOCH_CHANGED, {}, 16);
  ASSERT_THAT(chunks, SizeIs(1));
  EXPECT_TRUE(chunks[0].has_snapshot());
  EXPECT_TRUE(chunks[0].snapshot().complete());
  EXPECT_TRUE(chunks[0].snapshot().blocks().empty());
  EXPECT_EQ(chunks[0].snapshot().sequence(), 0u);
}

void ExpectChunksWellFormed(const std::vector<iv1::KvEventBatch>& chunks, int64_t limit,
                            const HeldMap& want) {
  HeldMap folded;
  for (size_t i = 0; i < chunks.size(); ++i) {
    EXPECT_LE(static_cast<int64_t>(chunks[i].ByteSizeLong()), limit) << "chunk " << i;
    EXPECT_EQ(chunks[i].snapshot().complete(), i + 1 == chunks.size()) << "chunk " << i;
    EXPECT_TRUE(chunks[i].events().empty());
    Fold(chunks[i], i == 0, &folded);
  }
  EXPECT_EQ(folded.size(), want.size());
  EXPECT_TRUE(folded == want) << "the chunks' union differs from the held set";
}

TEST(KvEventLogTest, LargeSnapshotsAreChunkedBelowTheLimitWithParentsKept) {
  KvEventLog log(kEpoch, {});
  // One chain longer than a chunk, then many short chains.
  log.Stored(Chain(1'000'000, 40'000), std::nullopt);
  for (uint64_t i = 0; i < 2000; ++i) {
    log.Stored(Chain(i * 100, 1 + static_cast<int>(i % 40)), std::nullopt);
  }
  const HeldMap want = ToMap(log.HeldBlocks());
  const int64_t limit = 64 << 10;
  std::vector<iv1::KvEventBatch> chunks =
      BuildSnapshotBatches("worker-with-a-long-name", kEpoch, log.last_sequence(),
                           iv1::SNAPSHOT_REASON_HISTORY_TRUNCATED, log.HeldBlocks(), 16, limit);
  EXPECT_GE(chunks.size(), static_cast<size_t>(want.size() * 16 / limit));
  ExpectChunksWellFormed(chunks, limit, want);

  chunks = BuildSnapshotBatches("w", kEpoch, log.last_sequence(), iv1::SNAPSHOT_REASON_REQUESTED,
                                log.HeldBlocks(), 16);
  EXPECT_GE(chunks.size(), 2u);
  ExpectChunksWellFormed(chunks, kMaxBatchBytes, want);
}

// Random stored/removed/cleared sequences: a snapshot taken at any point plus the events after
// it folds to the held set, and so do all events from the start.
TEST(KvEventLogTest, SnapshotPlusLaterEventsFoldToTheHeldSet) {
  absl::BitGen gen;
  for (int round = 0; round < 5; ++round) {
    KvEventLog log(kEpoch, {});
    std::vector<BlockHash> held;
    uint64_t next = static_cast<uint64_t>(round) << 32;
    std::vector<iv1::KvEventBatch> snapshot;
    uint64_t snapshot_at = 0;
    const int cut = absl::Uniform(gen, 0, 300);
    for (int op = 0; op < 300; ++op) {
      if (op == cut) {
        snapshot_at = log.last_sequence();
        snapshot = BuildSnapshotBatches("w", kEpoch, snapshot_at, iv1::SNAPSHOT_REASON_REQUESTED,
                                        log.HeldBlocks(), 16, 4096);
      }
      const int kind = absl::Uniform(gen, 0, 100);
      if (kind < 60 || held.empty()) {
        std::optional<BlockHash> parent;
        if (!held.empty() && absl::Bernoulli(gen, 0.5)) {
          parent = held[absl::Uniform<size_t>(gen, 0, held.size())];
        }
        std::vector<BlockHash> run = Chain(next, absl::Uniform(gen, 1, 30));
        next += run.size();
        log.Stored(run, parent);
        held.insert(held.end(), run.begin(), run.end());
      } else if (kind < 98) {
        std::shuffle(held.begin(), held.end(), gen);
        const size_t n = absl::Uniform<size_t>(gen, 1, std::min<size_t>(held.size(), 20) + 1);
        log.Removed(absl::MakeConstSpan(held).subspan(held.size() - n));
        held.resize(held.size() - n);
      } else {
        log.Cleared();
        held.clear();
      }
    }
    const HeldMap want = ToMap(log.HeldBlocks());
    EXPECT_EQ(want.size(), held.size());

    HeldMap from_start;
    iv1::KvEventBatch all;
    ASSERT_TRUE(log.CopyEvents(0, 1 << 20, int64_t{1} << 40, "w", all.mutable_events()).ok());
    Fold(all, false, &from_start);
    EXPECT_TRUE(from_start == want) << "round " << round;

    HeldMap from_snapshot;
    for (size_t i = 0; i < snapshot.size(); ++i) {
      Fold(snapshot[i], i == 0, &from_snapshot);
    }
    iv1::KvEventBatch rest;
    ASSERT_TRUE(
        log.CopyEvents(snapshot_at, 1 << 20, int64_t{1} << 40, "w", rest.mutable_events()).ok());
    if (rest.events_size() > 0) {
      EXPECT_EQ(rest.events(0).sequence(), snapshot_at + 1);
    }
    Fold(rest, false, &from_snapshot);
    EXPECT_TRUE(from_snapshot == want) << "round " << round << ", snapshot at " << snapshot_at;
  }
}

TEST(KvEventPublisherTest, RejectsInvalidConfig) {
  KvEventPublisherConfig config;
  config.max_batch_events = 0;
  EXPECT_EQ(KvEventPublisher::Create(config).status().code(), absl::StatusCode::kInvalidArgument);
  config = {};
  config.history_events = 0;
  EXPECT_EQ(KvEventPublisher::Create(config).status().code(), absl::StatusCode::kInvalidArgument);
  config = {};
  config.heartbeat_interval = absl::ZeroDuration();
  EXPECT_EQ(KvEventPublisher::Create(config).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(KvEventPublisherTest, ListenerCallbacksFeedTheLogWithoutAServer) {
  absl::StatusOr<std::unique_ptr<KvEventPublisher>> p = KvEventPublisher::Create({});
  ASSERT_TRUE(p.ok()) << p.status();
  absl::StatusOr<std::unique_ptr<KvEventPublisher>> other = KvEventPublisher::Create({});
  ASSERT_TRUE(other.ok());
  EXPECT_NE((*p)->epoch(), 0u);
  EXPECT_NE((*p)->epoch(), (*other)->epoch());
  kvcache::KvEventListener* listener = p->get();
  const std::vector<BlockHash> a = Chain(0, 3);
  listener->OnBlocksStored(a, std::nullopt);
  listener->OnBlocksStored({H(50)}, a[2]);
  listener->OnBlocksRemoved({a[0]});
  KvEventPublisherStats s = (*p)->Stats();
  EXPECT_EQ(s.events_published, 3);
  EXPECT_EQ(s.last_sequence, 3u);
  EXPECT_EQ(s.held_blocks, 3);
  EXPECT_EQ(s.subscribers, 0);
  EXPECT_EQ(ToMap((*p)->HeldBlocksForTest()).at(H(50)), a[2]);
  listener->OnAllCleared();
  EXPECT_EQ((*p)->Stats().held_blocks, 0);
  EXPECT_EQ((*p)->Stats().events_published, 4);
  (*p)->Shutdown();
  (*p)->Shutdown();  // idempotent
}

}  // namespace
}  // namespace pd::kv_events
