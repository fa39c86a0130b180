// TierStore: the node's lower tiers as one store: the DRAM pool (G2), the NVMe store (G3,
// optional) and the admission guard between them. It implements the storage side of every
// TierService flow in tierd.proto (Lookup, AllocateSlots, Commit, Promote, Release), the
// watermark-driven spill from DRAM to NVMe, and NVMe restores; the gRPC service adds sessions,
// proto conversion and the Redis index on top.
//
// Moves between tiers (docs/architecture.md, "Tiers"; docs/tiers.md; issue #6 item 3):
//   spill    DRAM -> NVMe: the coldest unpinned DRAM blocks leave DRAM; each is written to NVMe
//            when NVMe exists, accepts spills, does not hold it yet and the AdmissionGuard
//            admits it (seen at least twice); otherwise it is dropped. Each DRAM copy is
//            verified against the checksum taken at Commit before it is written (workers map
//            the pool read-write, so a stray write must not reach the disk as a valid block;
//            NvmeStore verifies again on every read). Triggered by SpillToWatermark (above the
//            high watermark, down to the low one) and by AllocateSlots/Promote when DRAM has no
//            free slot (just enough room, synchronously).
//   restore  NVMe -> DRAM: Promote reads a run of NVMe blocks straight into reserved DRAM slots
//            (one I/O batch), each verified by NvmeStore, committed and pinned for the session
//            atomically.
//   drop     NVMe full -> NvmeStore evicts its own coldest block on the next write.
// Visits counted by the guard: every offered hash (AllocateSlots) and every Promote hit.
//
// Conflicting offers (issue #40): one hash names one content, since workers of one model,
// dtype and layout compute bit-identical blocks for it (docs/tiers.md "Exactness"). A block
// offered under a hash the node holds, with another checksum (AllocateSlots with checksums, or
// the Commit of an unbound slot), is evidence that one of the two writers is wrong: a planted
// block or a broken worker. tierd cannot tell which, so it keeps neither: the held block is
// dropped from DRAM and NVMe, the hash is remembered as disputed (a bounded FIFO set) and
// every later offer or commit of it is refused (kRefused), so the next restore of that prefix
// recomputes it. Counted (conflicting_commits_total) and logged (at most once a second).
//
// Thread-safety: thread-safe; the parts are, and TierStore keeps only counters. Two sessions
// promoting the same NVMe block at once: one restores it, the other's chain stops there (it
// recomputes or asks again).
#pragma once

#include <cstdint>
#include <deque>
#include <optional>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/functional/any_invocable.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/hash/block_hash.h"
#include "common/time/clock.h"
#include "services/tier_shm/tier_kind.h"
#include "services/tierd/admission_guard.h"
#include "services/tierd/dram_pool.h"
#include "services/tierd/nvme_store.h"

namespace pd::tierd {

struct TierStoreConfig {
  // Largest NVMe batch of a spill or restore, in blocks (>= 1).
  int64_t io_batch_blocks = 64;
  // Disputed hashes remembered (>= 1); the oldest is forgotten first (and could then be stored
  // again). 65536 hashes cost about 2 MiB.
  int64_t max_disputed_blocks = 65536;
};

// A block readable in a DRAM slot pinned for the session (tierd.proto PromotedBlock).
struct PromotedBlock {
  DramSlot slot;
  uint64_t checksum = 0;
  tier_shm::TierKind source =
      tier_shm::TierKind::kDram;  // kNvme: read from NVMe into DRAM by this call
};

// What one spill (eviction round) did; every candidate is counted once.
struct SpillResult {
  int64_t written = 0;          // written to NVMe
  int64_t already_on_nvme = 0;  // NVMe had it: the DRAM copy just left
  int64_t dropped = 0;          // not admitted, no NVMe tier, or NVMe not accepting spills
  int64_t failed = 0;           // the NVMe write failed (dropped)
  int64_t corrupt = 0;          // the DRAM copy failed its checksum (dropped)

  int64_t total() const { return written + already_on_nvme + dropped + failed + corrupt; }
};

struct TierStoreStats {
  DramPoolStats dram;
  std::optional<NvmeStoreStats> nvme;  // absent without an NVMe tier
  AdmissionGuardStats guard;
  uint64_t spilled_blocks_total = 0;        // written to NVMe by spills
  uint64_t spill_dropped_blocks_total = 0;  // left DRAM without reaching NVMe (all reasons)
  uint64_t spill_bytes_total = 0;           // block bytes written by spills
  absl::Duration spill_time_total;          // wall time inside spill rounds that wrote
  uint64_t restored_blocks_total = 0;       // NVMe -> DRAM by Promote
  uint64_t restore_bytes_total = 0;
  absl::Duration restore_time_total;
  uint64_t restore_failures_total = 0;  // NVMe reads that failed (checksum included)
  uint64_t dram_corrupt_total = 0;      // DRAM blocks failing their checksum when spilled
  // Offers of a held hash with another checksum (the held block was dropped, the hash disputed).
  uint64_t conflicting_commits_total = 0;
  uint64_t refused_disputed_total = 0;  // offers and commits refused because the hash is disputed
  int64_t disputed_blocks = 0;          // gauge: hashes remembered as disputed now
};

// Told which blocks may have changed tier: stored in DRAM (Commit, NVMe restore), moved down
// or dropped (spill), dropped from NVMe (full, corrupt). The receiver asks Lookup for the
// block's tier now (it may have changed again since). Runs on the thread of the call that
// caused it, possibly under a tier's lock: it must be quick (queue the hashes) and must not
// call into the store.
using TierChangeListener = absl::AnyInvocable<void(absl::Span<const BlockHash> hashes)>;

class TierStore {
 public:
  // `dram` and `guard` are required, `nvme` may be null (no NVMe tier); none is owned and all
  // outlive the store. `clock` times spills and restores (for bandwidth metrics).
  TierStore(DramPool* dram, NvmeStore* nvme, AdmissionGuard* guard, TierStoreConfig config = {},
            Clock* clock = Clock::Real());

  TierStore(const TierStore&) = delete;
  TierStore& operator=(const TierStore&) = delete;
  // Detaches its drop listener from the NVMe store (which may outlive it).
  ~TierStore();

  // Tier of each leading block of `chain` held by the node (DRAM before NVMe), stopping at the
  // first miss. Advisory: nothing is pinned and no visit is counted.
  std::vector<tier_shm::TierKind> Lookup(absl::Span<const BlockHash> chain) const;

  // One reservation per hash (tierd.proto AllocateSlots): kAlreadyHeld when DRAM or NVMe holds
  // it or someone is offering it; kNoSpace when no DRAM slot can be freed (all reserved or
  // pinned); kRefused when the hash is disputed, or becomes disputed now because `checksums`
  // (empty, or one per hash: the offered blocks' XXH3-64) differs from the held block's (see
  // the class comment). Spills synchronously when DRAM is full. Counts a visit of every hash.
  // Then `unbound` reservations for blocks named at Commit (DramPool::ReserveUnbound), appended.
  // `checksums` of another size than `hashes` are ignored (the caller validates).
  std::vector<Reservation> AllocateSlots(SessionId session, absl::Span<const BlockHash> hashes,
                                         int64_t unbound = 0,
                                         absl::Span<const uint64_t> checksums = {});

  // Hands a filled slot over (DramPool::Commit, verifying the checksum). kRefused (the
  // reservation ends) when the hash is disputed. An unbound reservation's block counts a visit
  // here, ends kRefused when the node holds the hash with another checksum (a conflict, as in
  // AllocateSlots), and kAlreadyHeld when NVMe or DRAM holds it.
  CommitOutcome Commit(SessionId session, DramSlot slot, const BlockHash& hash, uint64_t checksum);

  // Whether `hash` is disputed now.
  bool IsDisputed(const BlockHash& hash) const;

  // Makes the leading blocks of `chain` readable in DRAM slots pinned for `session`, reading
  // NVMe blocks into DRAM; stops at the first block it cannot provide (miss, failed or corrupt
  // read, no DRAM slot). Counts a visit of every block returned.
  std::vector<PromotedBlock> Promote(SessionId session, absl::Span<const BlockHash> chain);

  // Claims (DramPool::Release / ReleaseSession / ExpireClaims).
  int Release(SessionId session, absl::Span<const DramSlot> slots);
  int ReleaseSession(SessionId session);
  int ExpireClaims();

  // Spills while DRAM is above its high watermark, down to the low one. Call it after commits
  // and periodically (the service's background thread).
  SpillResult SpillToWatermark();
  // Takes up to `max_blocks` of the coldest DRAM blocks out (see the class comment).
  SpillResult Evict(int64_t max_blocks);

  // Sets the change listener (see TierChangeListener). Call once, before the store is used by
  // several threads.
  void SetChangeListener(TierChangeListener listener);

  // Every block the node holds with its fastest tier (DRAM before NVMe). O(blocks).
  std::vector<std::pair<BlockHash, tier_shm::TierKind>> Snapshot() const;

  DramPool* dram() const { return dram_; }
  NvmeStore* nvme() const { return nvme_; }

  TierStoreStats Stats() const;

 private:
  // Reads the NVMe blocks chain[0..n) into DRAM pinned for `session`; appends what it restored
  // to `out` and returns how many (fewer than n = stop the chain).
  size_t RestoreRun(SessionId session, absl::Span<const BlockHash> run,
                    std::vector<PromotedBlock>* out);
  // The checksum of the node's copy of `hash` (DRAM, else NVMe), or nullopt.
  std::optional<uint64_t> HeldChecksum(const BlockHash& hash) const;
  // Offered `offered` for `hash` while the node holds `held`: drops the node's copy, marks the
  // hash disputed, counts and logs it.
  void OnConflict(SessionId session, const BlockHash& hash, uint64_t held, uint64_t offered);
  // Counts a refusal when `hash` is disputed; returns whether it is.
  bool RefuseIfDisputed(const BlockHash& hash);

  DramPool* const dram_;
  NvmeStore* const nvme_;
  AdmissionGuard* const guard_;
  const TierStoreConfig config_;
  Clock* const clock_;
  TierChangeListener listener_;  // may be empty

  mutable absl::Mutex mu_;
  TierStoreStats counters_ ABSL_GUARDED_BY(mu_);  // only the *_total fields are used
  // Disputed hashes: the set, and the same in arrival order to forget the oldest.
  absl::flat_hash_set<BlockHash> disputed_ ABSL_GUARDED_BY(mu_);
  std::deque<BlockHash> disputed_order_ ABSL_GUARDED_BY(mu_);
  absl::Time next_conflict_log_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  uint64_t unlogged_conflicts_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace pd::tierd
