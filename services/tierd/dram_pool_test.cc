#include "services/tierd/dram_pool.h"

#include <unistd.h>

#include <atomic>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/time/clock.h"
#include "gtest/gtest.h"
#include "services/tier_shm/block_checksum.h"

namespace pd::tierd {
namespace {

constexpr SessionId kWorkerA{1};
constexpr SessionId kWorkerB{2};

std::string UniqueShmName() {
  static std::atomic<int> counter{0};
  return absl::StrCat("/pd-tierd-test-", getpid(), "-", counter++);
}

BlockHash H(uint64_t i) { return BlockHash{i, ~i}; }

class DramPoolTest : public ::testing::Test {
 protected:
  std::unique_ptr<DramPool> MakePool(int64_t num_slots, int64_t block_bytes = 1000,
                                     double high = 0.9, double low = 0.75) {
    DramPoolConfig config;
    config.shm_name = UniqueShmName();
    config.num_slots = num_slots;
    config.block_bytes = block_bytes;
    config.high_watermark = high;
    config.low_watermark = low;
    config.lease = absl::Seconds(10);
    absl::StatusOr<std::unique_ptr<DramPool>> pool = DramPool::Create(config, &clock_);
    EXPECT_TRUE(pool.ok()) << pool.status();
    return pool.ok() ? *std::move(pool) : nullptr;
  }

  // Fills the reserved slot with a pattern of `hash` and commits it; returns the checksum.
  uint64_t Store(DramPool& pool, const BlockHash& hash, SessionId session = kWorkerA) {
    Reservation r = pool.Reserve(hash, session);
    EXPECT_EQ(r.outcome, ReserveOutcome::kGranted);
    absl::Span<uint8_t> block = pool.BlockSpan(r.slot);
    for (size_t i = 0; i < block.size(); ++i) {
      block[i] = static_cast<uint8_t>(hash.high * 31 + i);
    }
    const uint64_t checksum = tier_shm::BlockChecksum(block);
    EXPECT_EQ(pool.Commit(session, r.slot, hash, checksum), CommitOutcome::kStored);
    return checksum;
  }

  FakeClock clock_;
};

TEST_F(DramPoolTest, GeometryIsPageAligned) {
  auto pool = MakePool(4, 5000);
  ASSERT_NE(pool, nullptr);
  EXPECT_EQ(pool->slot_bytes(), 8192);
  EXPECT_EQ(pool->size_bytes(), 4u * 8192);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(pool->SlotData(DramSlot(3))) % 4096, 0u);
  EXPECT_EQ(pool->SlotData(DramSlot(1)) - pool->SlotData(DramSlot(0)), 8192);
}

TEST_F(DramPoolTest, UnboundReservationIsNamedAtCommit) {
  auto pool = MakePool(4);
  ASSERT_NE(pool, nullptr);
  Store(*pool, H(7));
  Reservation a = pool->ReserveUnbound(kWorkerA);
  Reservation b = pool->ReserveUnbound(kWorkerA);
  Reservation c = pool->ReserveUnbound(kWorkerB);
  ASSERT_EQ(a.outcome, ReserveOutcome::kGranted);
  ASSERT_EQ(b.outcome, ReserveOutcome::kGranted);
  ASSERT_EQ(c.outcome, ReserveOutcome::kGranted);
  EXPECT_EQ(pool->ReserveUnbound(kWorkerA).outcome, ReserveOutcome::kNoSpace);
  EXPECT_EQ(pool->Stats().unbound_blocks, 3);
  EXPECT_TRUE(pool->IsUnboundReservation(kWorkerA, a.slot));
  EXPECT_FALSE(pool->IsUnboundReservation(kWorkerB, a.slot));
  EXPECT_EQ(pool->StateOf(a.slot), SlotState::kWriting);
  std::memset(pool->SlotData(a.slot), 0x11, pool->block_bytes());
  const uint64_t checksum = tier_shm::BlockChecksum(pool->BlockSpan(a.slot));
  // Another session cannot name it; the owner names it at Commit.
  EXPECT_EQ(pool->Commit(kWorkerB, a.slot, H(1), checksum), CommitOutcome::kNotReserved);
  EXPECT_EQ(pool->Commit(kWorkerA, a.slot, H(1), checksum), CommitOutcome::kStored);
  EXPECT_TRUE(pool->Contains(H(1)));
  EXPECT_FALSE(pool->IsUnboundReservation(kWorkerA, a.slot));
  // A block the pool already holds (or is filling) ends the reservation, slot freed.
  EXPECT_EQ(pool->Commit(kWorkerA, b.slot, H(7), 0), CommitOutcome::kAlreadyHeld);
  EXPECT_EQ(pool->StateOf(b.slot), SlotState::kFree);
  Reservation named = pool->Reserve(H(9), kWorkerA);  // reuses the freed slot
  ASSERT_EQ(named.outcome, ReserveOutcome::kGranted);
  EXPECT_EQ(pool->Commit(kWorkerB, c.slot, H(9), 0), CommitOutcome::kAlreadyHeld);
  // A wrong checksum drops the block like a named reservation's.
  Reservation d = pool->ReserveUnbound(kWorkerB);
  ASSERT_EQ(d.outcome, ReserveOutcome::kGranted);
  EXPECT_EQ(pool->Commit(kWorkerB, d.slot, H(3), 12345), CommitOutcome::kChecksumMismatch);
  EXPECT_FALSE(pool->Contains(H(3)));
  EXPECT_EQ(pool->Reserve(H(3), kWorkerB).outcome, ReserveOutcome::kGranted);
  EXPECT_EQ(pool->Stats().unbound_blocks, 0);
}

TEST_F(DramPoolTest, UnboundReservationsExpireAndReleaseWithoutTouchingTheIndex) {
  auto pool = MakePool(3);
  ASSERT_NE(pool, nullptr);
  Store(*pool, H(1));
  Reservation a = pool->ReserveUnbound(kWorkerA);
  Reservation b = pool->ReserveUnbound(kWorkerB);
  ASSERT_EQ(a.outcome, ReserveOutcome::kGranted);
  ASSERT_EQ(b.outcome, ReserveOutcome::kGranted);
  EXPECT_EQ(pool->Release(kWorkerA, {a.slot}), 1);
  EXPECT_EQ(pool->StateOf(a.slot), SlotState::kFree);
  clock_.Advance(absl::Seconds(11));
  EXPECT_EQ(pool->ExpireClaims(), 1);
  EXPECT_EQ(pool->StateOf(b.slot), SlotState::kFree);
  EXPECT_TRUE(pool->Contains(H(1)));  // the stored block is untouched
  EXPECT_EQ(pool->Stats().unbound_blocks, 0);
  EXPECT_EQ(pool->Reserve(H(1), kWorkerB).outcome, ReserveOutcome::kAlreadyHeld);
}

TEST_F(DramPoolTest, OfferFlowReserveCommitPinRelease) {
  auto pool = MakePool(4);
  ASSERT_NE(pool, nullptr);
  Reservation r = pool->Reserve(H(1), kWorkerA);
  ASSERT_EQ(r.outcome, ReserveOutcome::kGranted);
  EXPECT_EQ(pool->StateOf(r.slot), SlotState::kWriting);
  // Held while being written: a second offer (any session) is told to skip the copy.
  EXPECT_EQ(pool->Reserve(H(1), kWorkerB).outcome, ReserveOutcome::kAlreadyHeld);
  EXPECT_FALSE(pool->Contains(H(1)));
  EXPECT_FALSE(pool->Pin(H(1), kWorkerB).has_value());

  std::memset(pool->SlotData(r.slot), 0xab, pool->block_bytes());
  const uint64_t checksum = tier_shm::BlockChecksum(pool->BlockSpan(r.slot));
  // Only the reserving session, for the reserved hash, may commit.
  EXPECT_EQ(pool->Commit(kWorkerB, r.slot, H(1), checksum), CommitOutcome::kNotReserved);
  EXPECT_EQ(pool->Commit(kWorkerA, r.slot, H(2), checksum), CommitOutcome::kNotReserved);
  EXPECT_EQ(pool->Commit(kWorkerA, r.slot, H(1), checksum), CommitOutcome::kStored);
  EXPECT_EQ(pool->StateOf(r.slot), SlotState::kValid);
  EXPECT_TRUE(pool->Contains(H(1)));
  EXPECT_EQ(pool->Reserve(H(1), kWorkerB).outcome, ReserveOutcome::kAlreadyHeld);

  std::optional<PinnedBlock> pin = pool->Pin(H(1), kWorkerB);
  ASSERT_TRUE(pin.has_value());
  EXPECT_EQ(pin->slot, r.slot);
  EXPECT_EQ(pin->checksum, checksum);
  EXPECT_EQ(pool->StateOf(r.slot), SlotState::kPinned);
  // Another session's release does not drop B's pin; B's does, once (Release is idempotent).
  const DramSlot slots[] = {r.slot};
  EXPECT_EQ(pool->Release(kWorkerA, slots), 0);
  EXPECT_EQ(pool->Release(kWorkerB, slots), 1);
  EXPECT_EQ(pool->Release(kWorkerB, slots), 0);
  EXPECT_EQ(pool->StateOf(r.slot), SlotState::kValid);

  const DramPoolStats stats = pool->Stats();
  EXPECT_EQ(stats.capacity_blocks, 4);
  EXPECT_EQ(stats.used_blocks, 1);
  EXPECT_EQ(stats.valid_blocks, 1);
  EXPECT_EQ(stats.pinned_blocks, 0);
  EXPECT_EQ(stats.stored_blocks_total, 1u);
  EXPECT_EQ(stats.hit_blocks_total, 1u);
  EXPECT_EQ(stats.written_bytes_total, 1000u);
}

// A worker maps the pool by name from Attach's geometry and sees (and can write) the slots.
TEST_F(DramPoolTest, WorkerMapsThePoolByName) {
  auto pool = MakePool(4, 5000);
  ASSERT_NE(pool, nullptr);
  const uint64_t checksum = Store(*pool, H(7));
  absl::StatusOr<std::unique_ptr<tier_shm::ShmRegion>> worker =
      tier_shm::MapDramPool(pool->shm_name(), pool->num_slots(), pool->slot_bytes());
  ASSERT_TRUE(worker.ok()) << worker.status();
  std::optional<PinnedBlock> pin = pool->Pin(H(7), kWorkerB);
  ASSERT_TRUE(pin.has_value());
  const uint8_t* mine = (*worker)->data() + pin->slot.value() * pool->slot_bytes();
  EXPECT_EQ(tier_shm::BlockChecksum(absl::MakeConstSpan(mine, 5000)), checksum);
  EXPECT_EQ(tier_shm::MapDramPool(pool->shm_name(), 5, pool->slot_bytes()).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(tier_shm::MapDramPool(pool->shm_name(), 4, 5000).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(DramPoolTest, CommitWithWrongChecksumFreesTheSlot) {
  auto pool = MakePool(2);
  ASSERT_NE(pool, nullptr);
  Reservation r = pool->Reserve(H(1), kWorkerA);
  ASSERT_EQ(r.outcome, ReserveOutcome::kGranted);
  std::memset(pool->SlotData(r.slot), 1, pool->block_bytes());
  const uint64_t wrong = tier_shm::BlockChecksum(pool->BlockSpan(r.slot)) ^ 1;
  EXPECT_EQ(pool->Commit(kWorkerA, r.slot, H(1), wrong), CommitOutcome::kChecksumMismatch);
  EXPECT_EQ(pool->StateOf(r.slot), SlotState::kFree);
  EXPECT_FALSE(pool->Contains(H(1)));
  EXPECT_EQ(pool->Stats().checksum_failures_total, 1u);
  // The hash can be offered again.
  EXPECT_EQ(pool->Reserve(H(1), kWorkerA).outcome, ReserveOutcome::kGranted);
}

TEST_F(DramPoolTest, ReleasingAReservationFreesTheSlot) {
  auto pool = MakePool(1);
  ASSERT_NE(pool, nullptr);
  Reservation r = pool->Reserve(H(1), kWorkerA);
  ASSERT_EQ(r.outcome, ReserveOutcome::kGranted);
  EXPECT_EQ(pool->Reserve(H(2), kWorkerA).outcome, ReserveOutcome::kNoSpace);
  const DramSlot slots[] = {r.slot};
  EXPECT_EQ(pool->Release(kWorkerA, slots), 1);
  EXPECT_EQ(pool->StateOf(r.slot), SlotState::kFree);
  EXPECT_EQ(pool->Reserve(H(2), kWorkerA).outcome, ReserveOutcome::kGranted);
}

TEST_F(DramPoolTest, EvictionCandidatesAreLeastRecentlyUsedAndUnpinned) {
  auto pool = MakePool(8);
  ASSERT_NE(pool, nullptr);
  for (uint64_t i = 0; i < 5; ++i) {
    Store(*pool, H(i));
  }
  // Access order now 0,1,2,3,4 (4 newest). Pin 0 (an access: it becomes the newest) and
  // keep 1 pinned so it cannot go; Contains is no access.
  ASSERT_TRUE(pool->Pin(H(0), kWorkerB).has_value());
  const DramSlot zero[] = {pool->Pin(H(0), kWorkerB)->slot};
  EXPECT_EQ(pool->Release(kWorkerB, zero), 1);
  EXPECT_EQ(pool->Release(kWorkerB, zero), 1);
  ASSERT_TRUE(pool->Pin(H(1), kWorkerA).has_value());
  EXPECT_TRUE(pool->Contains(H(2)));

  std::vector<EvictionCandidate> c = pool->TakeEvictionCandidates(3);
  ASSERT_EQ(c.size(), 3u);
  EXPECT_EQ(c[0].hash, H(2));  // 1 is older but pinned
  EXPECT_EQ(c[1].hash, H(3));
  EXPECT_EQ(c[2].hash, H(4));
  for (const EvictionCandidate& e : c) {
    EXPECT_EQ(pool->StateOf(e.slot), SlotState::kEvicting);
    EXPECT_FALSE(pool->Contains(e.hash));
    // Bytes stay readable until FinishEviction.
    EXPECT_EQ(tier_shm::BlockChecksum(pool->BlockSpan(e.slot)), e.checksum);
  }
  EXPECT_EQ(pool->Stats().evicting_blocks, 3);
  std::vector<DramSlot> slots;
  for (const EvictionCandidate& e : c) {
    slots.push_back(e.slot);
  }
  pool->FinishEviction(slots);
  EXPECT_EQ(pool->Stats().used_blocks, 2);
  EXPECT_EQ(pool->Stats().evicted_blocks_total, 3u);
  // Only 0 is evictable now (1 is pinned); hits are reported.
  c = pool->TakeEvictionCandidates(10);
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].hash, H(0));
  EXPECT_EQ(c[0].hits, 2u);
}

TEST_F(DramPoolTest, WatermarksSayHowMuchToSpill) {
  auto pool = MakePool(20, 1000, /*high=*/0.5, /*low=*/0.25);
  ASSERT_NE(pool, nullptr);
  for (uint64_t i = 0; i < 10; ++i) {
    Store(*pool, H(i));
  }
  EXPECT_EQ(pool->BlocksToSpill(), 0);  // 10 of 20 = exactly the high watermark
  Store(*pool, H(10));
  EXPECT_EQ(pool->BlocksToSpill(), 11 - 5);  // down to 25% of 20 = 5
  // Reserved slots count as occupied too.
  ASSERT_EQ(pool->Reserve(H(11), kWorkerA).outcome, ReserveOutcome::kGranted);
  EXPECT_EQ(pool->BlocksToSpill(), 12 - 5);
  // Evicting slots no longer count.
  EXPECT_EQ(pool->TakeEvictionCandidates(7).size(), 7u);
  EXPECT_EQ(pool->BlocksToSpill(), 0);
}

TEST_F(DramPoolTest, ClaimsExpireAfterTheLease) {
  auto pool = MakePool(4);
  ASSERT_NE(pool, nullptr);
  Store(*pool, H(1));
  Reservation r = pool->Reserve(H(2), kWorkerA);
  ASSERT_EQ(r.outcome, ReserveOutcome::kGranted);
  ASSERT_TRUE(pool->Pin(H(1), kWorkerB).has_value());
  clock_.Advance(absl::Seconds(9));
  EXPECT_EQ(pool->ExpireClaims(), 0);
  clock_.Advance(absl::Seconds(1));
  EXPECT_EQ(pool->ExpireClaims(), 2);
  EXPECT_EQ(pool->StateOf(r.slot), SlotState::kFree);
  EXPECT_TRUE(pool->Contains(H(1)));
  EXPECT_EQ(pool->Stats().pinned_blocks, 0);
  EXPECT_EQ(pool->Stats().expired_claims_total, 2u);
  // The expired reservation cannot be committed any more.
  EXPECT_EQ(pool->Commit(kWorkerA, r.slot, H(2), 0), CommitOutcome::kNotReserved);
}

TEST_F(DramPoolTest, TierdClaimsNeverExpireAndCommitCanPin) {
  auto pool = MakePool(2);
  ASSERT_NE(pool, nullptr);
  Reservation r = pool->Reserve(H(1), kTierdSession);
  ASSERT_EQ(r.outcome, ReserveOutcome::kGranted);
  clock_.Advance(absl::Hours(1));
  EXPECT_EQ(pool->ExpireClaims(), 0);
  // Commit without rehashing (the caller verified) and pin for a worker in the same step.
  EXPECT_EQ(pool->Commit(kTierdSession, r.slot, H(1), 1234,
                         CommitOptions{.verify_checksum = false, .pin_for = kWorkerA}),
            CommitOutcome::kStored);
  EXPECT_EQ(pool->StateOf(r.slot), SlotState::kPinned);
  EXPECT_TRUE(pool->TakeEvictionCandidates(1).empty());
  EXPECT_EQ(pool->ReleaseSession(kWorkerA), 1);
  EXPECT_EQ(pool->TakeEvictionCandidates(1).size(), 1u);
}

TEST_F(DramPoolTest, ReleaseSessionDropsEveryClaim) {
  auto pool = MakePool(4);
  ASSERT_NE(pool, nullptr);
  Store(*pool, H(1));
  ASSERT_EQ(pool->Reserve(H(2), kWorkerA).outcome, ReserveOutcome::kGranted);
  ASSERT_EQ(pool->Reserve(H(3), kWorkerB).outcome, ReserveOutcome::kGranted);
  ASSERT_TRUE(pool->Pin(H(1), kWorkerA).has_value());
  ASSERT_TRUE(pool->Pin(H(1), kWorkerA).has_value());
  EXPECT_EQ(pool->ReleaseSession(kWorkerA), 3);
  EXPECT_EQ(pool->Stats().used_blocks, 2);  // H(1) and B's reservation
  EXPECT_EQ(pool->Stats().pinned_blocks, 1);
}

TEST_F(DramPoolTest, ConfigValidation) {
  DramPoolConfig c;
  c.shm_name = "/pd-x";
  c.num_slots = 1;
  c.block_bytes = 1;
  EXPECT_TRUE(c.Validate().ok());
  DramPoolConfig bad = c;
  bad.shm_name = "no-slash";
  EXPECT_EQ(bad.Validate().code(), absl::StatusCode::kInvalidArgument);
  bad = c;
  bad.num_slots = 0;
  EXPECT_FALSE(bad.Validate().ok());
  bad = c;
  bad.low_watermark = 0.95;
  EXPECT_FALSE(bad.Validate().ok());
  bad = c;
  bad.high_watermark = 1.5;
  EXPECT_FALSE(bad.Validate().ok());
  bad = c;
  bad.lease = absl::ZeroDuration();
  EXPECT_FALSE(bad.Validate().ok());
  EXPECT_EQ(DramPoolConfig::DefaultShmName("node-1"), "/pdserve-node-1-g2");
  EXPECT_EQ(DramPoolConfig::DefaultShmName("a/b c"), "/pdserve-a_b_c-g2");
}

}  // namespace
}  // namespace pd::tierd
