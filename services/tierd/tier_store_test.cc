#include "services/tierd/tier_store.h"

#include <unistd.h>

#include <atomic>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/testing/temp_dir.h"
#include "common/time/clock.h"
#include "gtest/gtest.h"
#include "services/tier_shm/block_checksum.h"

namespace pd::tierd {
namespace {

constexpr SessionId kWorker{1};
constexpr int64_t kBlockBytes = 10240;  // stories260K: 16 tokens x 2 x 5 layers x 4 heads x 8 x f32

BlockHash H(uint64_t i) { return BlockHash{i + 1, i * 0x9e3779b97f4a7c15ull}; }

void Fill(const BlockHash& h, absl::Span<uint8_t> block) {
  for (size_t i = 0; i < block.size(); ++i) {
    block[i] = static_cast<uint8_t>((h.high * 131 + i * 7) >> 1);
  }
}

class TierStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<testing::TempDir> dir = testing::TempDir::Create("pd-tierd-store-");
    ASSERT_TRUE(dir.ok()) << dir.status();
    dir_ = std::make_unique<testing::TempDir>(*std::move(dir));
  }

  void Make(int64_t dram_slots, int64_t nvme_blocks, bool with_nvme = true, double high = 0.9,
            double low = 0.5) {
    static std::atomic<int> counter{0};
    DramPoolConfig dc;
    dc.shm_name = absl::StrCat("/pd-tierd-store-test-", getpid(), "-", counter++);
    dc.num_slots = dram_slots;
    dc.block_bytes = kBlockBytes;
    dc.high_watermark = high;
    dc.low_watermark = low;
    absl::StatusOr<std::unique_ptr<DramPool>> dram = DramPool::Create(dc, &clock_);
    ASSERT_TRUE(dram.ok()) << dram.status();
    dram_ = *std::move(dram);
    if (with_nvme) {
      NvmeStoreConfig nc;
      nc.dir = dir_->File("g3");
      nc.block_bytes = kBlockBytes;
      nc.capacity_blocks = nvme_blocks;
      nc.slots_per_slab = 16;
      nc.model_fingerprint = "stories260K";
      absl::StatusOr<std::unique_ptr<NvmeStore>> nvme = NvmeStore::Open(nc, &clock_);
      ASSERT_TRUE(nvme.ok()) << nvme.status();
      nvme_ = *std::move(nvme);
    }
    guard_ = std::make_unique<AdmissionGuard>(AdmissionGuardConfig{.expected_blocks = 1024});
    store_ = std::make_unique<TierStore>(dram_.get(), nvme_.get(), guard_.get(),
                                         TierStoreConfig{.io_batch_blocks = 8}, &clock_);
  }

  // The worker's side of an offer: reserve, copy, commit. Returns the outcome.
  ReserveOutcome Offer(uint64_t i) {
    std::vector<Reservation> r = store_->AllocateSlots(kWorker, {H(i)});
    if (r[0].outcome != ReserveOutcome::kGranted) {
      return r[0].outcome;
    }
    absl::Span<uint8_t> block = dram_->BlockSpan(r[0].slot);
    Fill(H(i), block);
    EXPECT_EQ(store_->Commit(kWorker, r[0].slot, H(i), tier_shm::BlockChecksum(block)),
              CommitOutcome::kStored);
    return ReserveOutcome::kGranted;
  }

  // The worker's side of a restore: the promoted blocks must carry the right bytes.
  std::vector<PromotedBlock> PromoteAndCheck(std::vector<uint64_t> ids) {
    std::vector<BlockHash> chain;
    for (uint64_t i : ids) {
      chain.push_back(H(i));
    }
    std::vector<PromotedBlock> got = store_->Promote(kWorker, chain);
    std::vector<uint8_t> want(kBlockBytes);
    std::vector<DramSlot> slots;
    for (size_t k = 0; k < got.size(); ++k) {
      Fill(H(ids[k]), absl::MakeSpan(want));
      absl::Span<uint8_t> block = dram_->BlockSpan(got[k].slot);
      EXPECT_EQ(std::memcmp(block.data(), want.data(), kBlockBytes), 0) << "block " << ids[k];
      EXPECT_EQ(tier_shm::BlockChecksum(block), got[k].checksum);
      EXPECT_EQ(dram_->StateOf(got[k].slot), SlotState::kPinned);
      slots.push_back(got[k].slot);
    }
    store_->Release(kWorker, slots);
    return got;
  }

  FakeClock clock_;
  std::unique_ptr<testing::TempDir> dir_;
  std::unique_ptr<DramPool> dram_;
  std::unique_ptr<NvmeStore> nvme_;
  std::unique_ptr<AdmissionGuard> guard_;
  std::unique_ptr<TierStore> store_;
};

TEST_F(TierStoreTest, OnlyBlocksSeenTwiceAreSpilledToNvme) {
  Make(8, 64);
  for (uint64_t i = 0; i < 4; ++i) {
    ASSERT_EQ(Offer(i), ReserveOutcome::kGranted);
  }
  // 0 and 1 are asked for again (a Promote hit is a visit), 2 and 3 are not.
  EXPECT_EQ(PromoteAndCheck({0, 1}).size(), 2u);
  const SpillResult r = store_->Evict(4);
  EXPECT_EQ(r.written, 2);
  EXPECT_EQ(r.dropped, 2);
  EXPECT_TRUE(nvme_->Contains(H(0)));
  EXPECT_TRUE(nvme_->Contains(H(1)));
  EXPECT_FALSE(nvme_->Contains(H(2)));
  EXPECT_FALSE(dram_->Contains(H(0)));
  // A dropped block offered a second time is written when it leaves DRAM again.
  ASSERT_EQ(Offer(2), ReserveOutcome::kGranted);
  EXPECT_EQ(store_->Evict(1).written, 1);
  EXPECT_TRUE(nvme_->Contains(H(2)));
  const TierStoreStats stats = store_->Stats();
  EXPECT_EQ(stats.spilled_blocks_total, 3u);
  EXPECT_EQ(stats.spill_dropped_blocks_total, 2u);
  EXPECT_EQ(stats.spill_bytes_total, 3u * kBlockBytes);
  ASSERT_TRUE(stats.nvme.has_value());
  EXPECT_EQ(stats.nvme->stored_blocks_total, 3u);
}

TEST_F(TierStoreTest, LookupAndPromoteWalkTheChainAcrossTiers) {
  Make(8, 64);
  for (uint64_t i = 0; i < 6; ++i) {
    ASSERT_EQ(Offer(i), ReserveOutcome::kGranted);
    ASSERT_EQ(store_->AllocateSlots(kWorker, {H(i)})[0].outcome, ReserveOutcome::kAlreadyHeld);
  }
  // Blocks 0..3 go down to NVMe (coldest first); 4 and 5 stay in DRAM.
  ASSERT_EQ(store_->Evict(4).written, 4);
  std::vector<BlockHash> chain = {H(0), H(1), H(4), H(2), H(3), H(5), H(77), H(4)};
  std::vector<tier_shm::TierKind> tiers = store_->Lookup(chain);
  EXPECT_EQ(tiers,
            (std::vector<tier_shm::TierKind>{
                tier_shm::TierKind::kNvme, tier_shm::TierKind::kNvme, tier_shm::TierKind::kDram,
                tier_shm::TierKind::kNvme, tier_shm::TierKind::kNvme, tier_shm::TierKind::kDram}));
  // An offer of a block on NVMe only is answered "already held".
  EXPECT_EQ(store_->AllocateSlots(kWorker, {H(0)})[0].outcome, ReserveOutcome::kAlreadyHeld);

  std::vector<PromotedBlock> got = PromoteAndCheck({0, 1, 4, 2, 3, 5, 77, 4});
  ASSERT_EQ(got.size(), 6u);  // stops at the miss
  EXPECT_EQ(got[0].source, tier_shm::TierKind::kNvme);
  EXPECT_EQ(got[2].source, tier_shm::TierKind::kDram);
  EXPECT_EQ(got[3].source, tier_shm::TierKind::kNvme);
  // Restored blocks stay in DRAM (and on NVMe).
  EXPECT_TRUE(dram_->Contains(H(0)));
  EXPECT_TRUE(nvme_->Contains(H(0)));
  const TierStoreStats stats = store_->Stats();
  EXPECT_EQ(stats.restored_blocks_total, 4u);
  EXPECT_EQ(stats.restore_bytes_total, 4u * kBlockBytes);
  // Evicting a restored block costs no second write.
  ASSERT_EQ(PromoteAndCheck({0}).size(), 1u);
  EXPECT_EQ(store_->Evict(8).already_on_nvme, 4);
}

TEST_F(TierStoreTest, FullDramMakesRoomOnOfferAndOnRestore) {
  Make(4, 64);
  for (uint64_t i = 0; i < 4; ++i) {
    ASSERT_EQ(Offer(i), ReserveOutcome::kGranted);
    store_->AllocateSlots(kWorker, {H(i)});  // second visit: spill-worthy
  }
  // DRAM is full: the next offer pushes the coldest block (0) down to NVMe.
  ASSERT_EQ(Offer(10), ReserveOutcome::kGranted);
  EXPECT_TRUE(nvme_->Contains(H(0)));
  EXPECT_FALSE(dram_->Contains(H(0)));
  // Restoring 0 into the full pool pushes the next coldest (1) down.
  ASSERT_EQ(PromoteAndCheck({0}).size(), 1u);
  EXPECT_TRUE(dram_->Contains(H(0)));
  EXPECT_TRUE(nvme_->Contains(H(1)));
  // With every slot pinned nothing can be freed: NO_SPACE, and the pins survive.
  std::vector<BlockHash> all = {H(0), H(2), H(3), H(10)};
  std::vector<PromotedBlock> pins = store_->Promote(kWorker, all);
  ASSERT_EQ(pins.size(), 4u);
  EXPECT_EQ(store_->AllocateSlots(kWorker, {H(20)})[0].outcome, ReserveOutcome::kNoSpace);
  EXPECT_EQ(store_->ReleaseSession(kWorker), 4);
  EXPECT_EQ(Offer(20), ReserveOutcome::kGranted);
}

TEST_F(TierStoreTest, SpillToWatermarkStopsAtTheLowWatermark) {
  Make(10, 64, true, /*high=*/0.8, /*low=*/0.4);
  for (uint64_t i = 0; i < 8; ++i) {
    ASSERT_EQ(Offer(i), ReserveOutcome::kGranted);
  }
  EXPECT_EQ(store_->SpillToWatermark().total(), 0);  // 8 of 10 is not above 80%
  ASSERT_EQ(Offer(8), ReserveOutcome::kGranted);
  const SpillResult r = store_->SpillToWatermark();
  EXPECT_EQ(r.total(), 9 - 4);
  EXPECT_EQ(dram_->Stats().used_blocks, 4);
  for (uint64_t i = 0; i < 5; ++i) {
    EXPECT_FALSE(dram_->Contains(H(i))) << i;  // the coldest went
  }
}

// A worker scribbling on a stored DRAM block: the spill checks the copy against the checksum
// taken at Commit and drops it instead of writing damaged bytes to disk.
TEST_F(TierStoreTest, CorruptDramCopyIsNotSpilled) {
  Make(4, 16);
  ASSERT_EQ(Offer(0), ReserveOutcome::kGranted);
  store_->AllocateSlots(kWorker, {H(0)});
  std::optional<PinnedBlock> pin = dram_->Pin(H(0), kWorker);
  ASSERT_TRUE(pin.has_value());
  dram_->BlockSpan(pin->slot)[100] ^= 0xff;  // a stray write by a worker
  const DramSlot slots[] = {pin->slot};
  store_->Release(kWorker, slots);
  const SpillResult r = store_->Evict(1);
  EXPECT_EQ(r.corrupt, 1);
  EXPECT_EQ(r.written, 0);
  EXPECT_FALSE(nvme_->Contains(H(0)));
  EXPECT_EQ(store_->Stats().dram_corrupt_total, 1u);
  EXPECT_EQ(dram_->Stats().used_blocks, 0);
}

TEST_F(TierStoreTest, CorruptNvmeBlockStopsTheChainAndIsDropped) {
  Make(8, 16);
  for (uint64_t i = 0; i < 3; ++i) {
    ASSERT_EQ(Offer(i), ReserveOutcome::kGranted);
    store_->AllocateSlots(kWorker, {H(i)});
  }
  ASSERT_EQ(store_->Evict(3).written, 3);
  std::optional<NvmeLocation> loc = nvme_->LocationOf(H(1));
  ASSERT_TRUE(loc.has_value());
  {
    FILE* f = fopen(loc->slab_path.c_str(), "r+b");
    ASSERT_NE(f, nullptr);
    fseek(f, loc->offset + 5, SEEK_SET);
    fputc(0x5a, f);
    fclose(f);
  }
  std::vector<PromotedBlock> got = PromoteAndCheck({0, 1, 2});
  EXPECT_EQ(got.size(), 1u);  // 0 restored; 1 failed its checksum, so the chain stops
  EXPECT_FALSE(nvme_->Contains(H(1)));
  EXPECT_FALSE(dram_->Contains(H(1)));
  EXPECT_FALSE(dram_->Contains(H(2)));  // its reservation was given back
  EXPECT_EQ(store_->Stats().restore_failures_total, 1u);
  EXPECT_EQ(dram_->Stats().used_blocks, 1);
}

TEST_F(TierStoreTest, WithoutNvmeEvictionDrops) {
  Make(4, 0, /*with_nvme=*/false);
  for (uint64_t i = 0; i < 4; ++i) {
    ASSERT_EQ(Offer(i), ReserveOutcome::kGranted);
    store_->AllocateSlots(kWorker, {H(i)});
  }
  EXPECT_EQ(Offer(4), ReserveOutcome::kGranted);
  EXPECT_FALSE(dram_->Contains(H(0)));
  EXPECT_EQ(store_->Lookup(std::vector<BlockHash>{H(1), H(0)}).size(), 1u);
  EXPECT_FALSE(store_->Stats().nvme.has_value());
}

// The poisoning signature (issue #40): a block planted under a hash, then the real block offered
// under the same hash with other bytes. tierd keeps neither (the next restore recomputes), counts
// the conflict and refuses the hash from then on, whichever tier held the planted copy and
// whichever offer path (named AllocateSlots, or an unbound slot named at Commit) brought the
// real one. Offers with the same bytes stay plain "already held".
TEST_F(TierStoreTest, ConflictingOfferDropsTheHeldBlockAndRefusesTheHash) {
  Make(8, 64);
  constexpr SessionId kAttacker{2};
  std::vector<uint8_t> real(kBlockBytes);
  // Plants garbage under H(i) through the ordinary offer flow; returns the real block's checksum.
  auto plant = [&](uint64_t i) {
    std::vector<Reservation> r = store_->AllocateSlots(kAttacker, {H(i)});
    EXPECT_EQ(r[0].outcome, ReserveOutcome::kGranted);
    absl::Span<uint8_t> block = dram_->BlockSpan(r[0].slot);
    std::memset(block.data(), 0x42, block.size());
    EXPECT_EQ(store_->Commit(kAttacker, r[0].slot, H(i), tier_shm::BlockChecksum(block)),
              CommitOutcome::kStored);
    Fill(H(i), absl::MakeSpan(real));
    return tier_shm::BlockChecksum(real);
  };

  // Planted in DRAM; the real offer names it with its checksum.
  const uint64_t real0 = plant(0);
  const uint64_t checksums0[] = {real0};
  EXPECT_EQ(store_->AllocateSlots(kWorker, {H(0)}, 0, checksums0)[0].outcome,
            ReserveOutcome::kRefused);
  EXPECT_FALSE(dram_->Contains(H(0)));
  EXPECT_TRUE(store_->Promote(kWorker, {H(0)}).empty()) << "the planted block is still served";
  EXPECT_TRUE(store_->IsDisputed(H(0)));
  // Refused from now on, with either content and on every path (no re-planting).
  EXPECT_EQ(store_->AllocateSlots(kWorker, {H(0)}, 0, checksums0)[0].outcome,
            ReserveOutcome::kRefused);
  EXPECT_EQ(store_->AllocateSlots(kAttacker, {H(0)})[0].outcome, ReserveOutcome::kRefused);
  std::vector<Reservation> unbound = store_->AllocateSlots(kAttacker, {}, 1);
  ASSERT_EQ(unbound[0].outcome, ReserveOutcome::kGranted);
  EXPECT_EQ(store_->Commit(kAttacker, unbound[0].slot, H(0), 42), CommitOutcome::kRefused);
  EXPECT_EQ(dram_->StateOf(unbound[0].slot), SlotState::kFree);

  // The same bytes offered again: no conflict.
  ASSERT_EQ(Offer(1), ReserveOutcome::kGranted);
  Fill(H(1), absl::MakeSpan(real));
  const uint64_t checksums1[] = {tier_shm::BlockChecksum(real)};
  EXPECT_EQ(store_->AllocateSlots(kWorker, {H(1)}, 0, checksums1)[0].outcome,
            ReserveOutcome::kAlreadyHeld);
  EXPECT_TRUE(dram_->Contains(H(1)));

  // Planted, then moved down to NVMe: dropped there too.
  const uint64_t real2 = plant(2);
  store_->AllocateSlots(kAttacker, {H(2)});  // a second visit: admitted to NVMe
  ASSERT_GE(store_->Evict(8).written, 1);
  ASSERT_TRUE(nvme_->Contains(H(2)));
  const uint64_t checksums2[] = {real2};
  EXPECT_EQ(store_->AllocateSlots(kWorker, {H(2)}, 0, checksums2)[0].outcome,
            ReserveOutcome::kRefused);
  EXPECT_FALSE(nvme_->Contains(H(2)));
  EXPECT_TRUE(store_->Lookup({H(2)}).empty());

  // The in-place path: the real block copied into an unbound slot and named at Commit, while a
  // restore has the planted copy pinned (it keeps its copy; the slot is freed at its release).
  const uint64_t real3 = plant(3);
  std::vector<PromotedBlock> pinned = store_->Promote(kAttacker, {H(3)});
  ASSERT_EQ(pinned.size(), 1u);
  unbound = store_->AllocateSlots(kWorker, {}, 1);
  ASSERT_EQ(unbound[0].outcome, ReserveOutcome::kGranted);
  Fill(H(3), dram_->BlockSpan(unbound[0].slot));
  EXPECT_EQ(store_->Commit(kWorker, unbound[0].slot, H(3), real3), CommitOutcome::kRefused);
  EXPECT_EQ(dram_->StateOf(unbound[0].slot), SlotState::kFree);
  EXPECT_FALSE(dram_->Contains(H(3)));
  EXPECT_EQ(dram_->StateOf(pinned[0].slot), SlotState::kPinned);
  const DramSlot pinned_slot[] = {pinned[0].slot};
  EXPECT_EQ(store_->Release(kAttacker, pinned_slot), 1);
  EXPECT_EQ(dram_->StateOf(pinned[0].slot), SlotState::kFree);

  const TierStoreStats stats = store_->Stats();
  EXPECT_EQ(stats.conflicting_commits_total, 3u);
  EXPECT_EQ(stats.refused_disputed_total, 3u);
  EXPECT_EQ(stats.disputed_blocks, 3);
  EXPECT_EQ(stats.dram.valid_blocks, 0);
  EXPECT_EQ(stats.dram.pinned_blocks, 0);
  EXPECT_EQ(store_->Lookup({H(1)}).size(), 1u);  // the undisputed block stays (now on NVMe)
}

// The disputed set is bounded: the oldest hash is forgotten first.
TEST_F(TierStoreTest, DisputedHashesAreBounded) {
  static std::atomic<int> counter{0};
  DramPoolConfig dc;
  dc.shm_name = absl::StrCat("/pd-tierd-store-bound-", getpid(), "-", counter++);
  dc.num_slots = 8;
  dc.block_bytes = kBlockBytes;
  absl::StatusOr<std::unique_ptr<DramPool>> dram = DramPool::Create(dc, &clock_);
  ASSERT_TRUE(dram.ok()) << dram.status();
  AdmissionGuard guard(AdmissionGuardConfig{.expected_blocks = 64});
  TierStore store(dram->get(), nullptr, &guard,
                  TierStoreConfig{.io_batch_blocks = 8, .max_disputed_blocks = 2}, &clock_);
  for (uint64_t i = 0; i < 3; ++i) {
    std::vector<Reservation> r = store.AllocateSlots(kWorker, {H(i)});
    ASSERT_EQ(r[0].outcome, ReserveOutcome::kGranted);
    absl::Span<uint8_t> block = (*dram)->BlockSpan(r[0].slot);
    ASSERT_EQ(store.Commit(kWorker, r[0].slot, H(i), tier_shm::BlockChecksum(block)),
              CommitOutcome::kStored);
    const uint64_t other[] = {tier_shm::BlockChecksum(block) + 1};
    ASSERT_EQ(store.AllocateSlots(kWorker, {H(i)}, 0, other)[0].outcome, ReserveOutcome::kRefused);
  }
  EXPECT_FALSE(store.IsDisputed(H(0)));
  EXPECT_TRUE(store.IsDisputed(H(1)));
  EXPECT_TRUE(store.IsDisputed(H(2)));
  EXPECT_EQ(store.Stats().disputed_blocks, 2);
  EXPECT_EQ(store.Stats().conflicting_commits_total, 3u);
}

}  // namespace
}  // namespace pd::tierd
