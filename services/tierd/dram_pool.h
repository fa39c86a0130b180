// DramPool: pd-tierd's DRAM tier (G2, docs/architecture.md, "Tiers"): a POSIX shared-memory region
// of num_slots slots that the node's workers map by name, plus tierd's bookkeeping of what every
// slot holds. The slot layout (slot i at i * slot_bytes, slot_bytes = block_bytes rounded up to
// 4096, page-aligned for O_DIRECT) is services/tier_shm/dram_slots.h, which the workers share.
//
// Slot life cycle (tierd.proto "Offer" and "Restore" flows):
//
//   kFree --Reserve(hash, session)--> kWriting --Commit(checksum ok)--> kValid <--> kPinned
//     ^                                  |  (checksum bad, Release,              (Pin / Release,
//     |                                  |   lease expiry)                        lease expiry)
//     +----------------------------------+
//     +---FinishEviction--- kEvicting <--TakeEvictionCandidates-- kValid (unpinned, coldest)
//
// - kWriting: reserved for one hash by one session, which copies the block in. The hash counts
//   as held (a second Reserve of it answers kAlreadyHeld) but Pin does not see it yet. An
//   unbound reservation (ReserveUnbound) names no hash yet: the session copies a block in first
//   (a worker evicting a block it must copy out before it could ask) and names it at Commit.
// - kValid: tierd owns the block; it is indexed by hash and sits in the LRU list ordered by last
//   access (Commit and Pin count as accesses; Contains does not).
// - kPinned: kValid with one or more read pins (several sessions may pin one block); pinned
//   slots are never evicted.
// - kEvicting: taken out of the index by tierd to copy it down to NVMe (or drop it); the bytes
//   stay intact until FinishEviction frees the slot.
// Claims (reservations and pins) expire `lease` after they are granted (ExpireClaims); tierd's
// own claims (kTierdSession) never expire.
//
// Checksums: every kValid slot carries the XXH3-64 (seed 0) of its block_bytes, kept in tierd's
// memory (never in the shared region, which workers can write). Commit verifies the slot's
// bytes against the worker's checksum; readers verify their copy against Pin's checksum.
//
// Watermarks: when the occupied slots (kWriting + kValid + kPinned) exceed high_watermark of
// the pool, BlocksToSpill() says how many of the coldest blocks to move down so that occupancy
// falls to low_watermark. The pool only decides what; TierStore moves the bytes.
//
// Thread-safety: thread-safe (one internal mutex; no call blocks on I/O). The slot bytes are
// not guarded: the claim protocol above says who may touch them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/base/strong_id.h"
#include "common/hash/block_hash.h"
#include "common/time/clock.h"
#include "services/tier_shm/dram_slots.h"
#include "services/tierd/slot_lru.h"

namespace pd::tierd {

// A slot of the DRAM pool, in [0, num_slots).
using DramSlot = StrongId<struct DramSlotTag, uint32_t>;
// A worker's session with tierd (AttachResponse.session_id; never 0 on the wire).
using SessionId = StrongId<struct SessionIdTag, uint64_t>;
// The session tierd uses for its own claims (NVMe restores); its claims never expire.
inline constexpr SessionId kTierdSession{0};

struct DramPoolConfig {
  // shm_open name, e.g. DefaultShmName("node1") = "/pdserve-node1-g2". Required.
  std::string shm_name;
  // Slots (= blocks) in the pool, in [1, 2^32 - 2].
  int64_t num_slots = 0;
  // Bytes of one KV block (kvcache::KvLayout::block_bytes()), in [1, 1 GiB].
  int64_t block_bytes = 0;
  // Occupancy fractions: spilling starts above high_watermark and stops at low_watermark.
  // 0 <= low_watermark < high_watermark <= 1.
  double high_watermark = 0.90;
  double low_watermark = 0.75;
  // Lifetime of a session's claim (AttachResponse.lease_ms). > 0, whole milliseconds.
  absl::Duration lease = absl::Seconds(30);
  // Allocate the region's pages at Create (see tier_shm::ShmRegion::Create); off only in tests of
  // huge sparse pools.
  bool reserve_memory = true;

  // InvalidArgument naming the first bad field.
  absl::Status Validate() const;

  // "/pdserve-<node>-g2", with characters other than [A-Za-z0-9._-] in `node` replaced by '_'.
  static std::string DefaultShmName(absl::string_view node);
};

// State of one slot (see the class comment). kPinned is kValid with at least one pin.
enum class SlotState : uint8_t { kFree, kWriting, kValid, kPinned, kEvicting };

// Answer to Reserve, mirroring tierd.proto's SlotGrantStatus.
enum class ReserveOutcome : uint8_t {
  kGranted,      // `slot` is reserved for the hash: fill it, then Commit or Release
  kAlreadyHeld,  // the pool holds the hash, or a session is filling it
  kNoSpace,      // no free slot (make room with TakeEvictionCandidates first)
  // (TierStore) the block is disputed: tierd saw two different contents offered under its hash
  // and takes neither (docs/tiers.md "Exactness"). Never returned by DramPool itself.
  kRefused,
};

struct Reservation {
  ReserveOutcome outcome = ReserveOutcome::kNoSpace;
  DramSlot slot;  // valid only for kGranted
};

// Answer to Commit, mirroring tierd.proto's CommitStatus.
enum class CommitOutcome : uint8_t {
  kStored,            // the block is kValid (and pinned when CommitOptions::pin_for is set)
  kChecksumMismatch,  // the slot's bytes do not hash to the checksum; slot freed
  kNotReserved,       // no reservation of this slot by this session for this hash
  kAlreadyHeld,       // (unbound reservations) the pool holds or is filling the hash; slot freed
  // (TierStore) the block is disputed (see ReserveOutcome::kRefused); the reservation ended and
  // nothing was stored. Never returned by DramPool itself.
  kRefused,
};

struct CommitOptions {
  // false when the caller has just verified the bytes itself (an NVMe read): skips rehashing.
  bool verify_checksum = true;
  // When valid, the stored block is pinned for this session atomically with the commit, so
  // nothing can evict it in between (the NVMe restore path).
  SessionId pin_for = SessionId::Invalid();
};

// A block readable in the pool, pinned for a session until Release or lease expiry.
struct PinnedBlock {
  DramSlot slot;
  uint64_t checksum = 0;
};

// A block taken out of the pool by TakeEvictionCandidates: its bytes stay readable at
// SlotData(slot) until FinishEviction.
struct EvictionCandidate {
  DramSlot slot;
  BlockHash hash;
  uint64_t checksum = 0;
  uint32_t hits = 0;  // Pin calls that found it since it was stored
};

// Snapshot for metrics (TierUsage in tierd.proto). Gauges are current values; *_total count
// since Create.
struct DramPoolStats {
  int64_t capacity_blocks = 0;        // num_slots
  int64_t used_blocks = 0;            // every slot not kFree (including reserved and evicting)
  int64_t valid_blocks = 0;           // kValid + kPinned
  int64_t pinned_blocks = 0;          // slots reserved or pinned by sessions (kWriting + kPinned)
  int64_t unbound_blocks = 0;         // of those, unbound reservations (ReserveUnbound)
  int64_t evicting_blocks = 0;        // kEvicting
  uint64_t stored_blocks_total = 0;   // successful Commits
  uint64_t evicted_blocks_total = 0;  // FinishEviction'ed slots
  uint64_t hit_blocks_total = 0;      // Pin hits
  uint64_t read_bytes_total = 0;      // block bytes handed out: Pin hits + evictions
  uint64_t written_bytes_total = 0;   // block bytes stored by Commit
  uint64_t checksum_failures_total = 0;  // Commits whose bytes did not match
  uint64_t expired_claims_total = 0;     // reservations and pins dropped by ExpireClaims
};

class DramPool {
 public:
  // Creates the shared-memory region (tier_shm::ShmRegion::Create; its errors, which name the shm
  // object) and an empty pool. `clock` (not owned, outlives the pool) times claim leases.
  // InvalidArgument when `config` is invalid.
  static absl::StatusOr<std::unique_ptr<DramPool>> Create(DramPoolConfig config,
                                                          Clock* clock = Clock::Real());

  DramPool(const DramPool&) = delete;
  DramPool& operator=(const DramPool&) = delete;
  ~DramPool();

  // Geometry, as AttachResponse reports it.
  const std::string& shm_name() const { return region_->name(); }
  int64_t num_slots() const { return config_.num_slots; }
  int64_t block_bytes() const { return config_.block_bytes; }
  int64_t slot_bytes() const { return slot_bytes_; }
  size_t size_bytes() const { return region_->size_bytes(); }
  absl::Duration lease() const { return config_.lease; }

  // First byte of `slot` (CHECKed in range): slot_bytes() bytes, 4096-aligned.
  uint8_t* SlotData(DramSlot slot) const;
  // The slot's block_bytes() bytes.
  absl::Span<uint8_t> BlockSpan(DramSlot slot) const;

  // Reserves a free slot for `hash` on behalf of `session`, or says why not. Does not evict.
  Reservation Reserve(const BlockHash& hash, SessionId session);
  // Reserves a free slot for a block `session` names only at Commit (kGranted or kNoSpace).
  Reservation ReserveUnbound(SessionId session);
  // Whether `slot` is an unbound reservation of `session`.
  bool IsUnboundReservation(SessionId session, DramSlot slot) const;

  // Turns `session`'s reservation of `slot` for `hash` into a stored block with `checksum`
  // (XXH3-64 of its block bytes), verifying the bytes unless options say otherwise. The block
  // becomes the most recently used. Ends the reservation in every outcome but kNotReserved. An
  // unbound reservation takes `hash` here, or ends kAlreadyHeld when the pool has it.
  CommitOutcome Commit(SessionId session, DramSlot slot, const BlockHash& hash, uint64_t checksum,
                       CommitOptions options = {});

  // Pins the stored block `hash` for `session` and counts a hit (an access for the LRU).
  // nullopt when the pool does not hold it as kValid/kPinned.
  std::optional<PinnedBlock> Pin(const BlockHash& hash, SessionId session);

  // Whether `hash` is stored (kValid/kPinned). Not an access: the LRU order does not change.
  bool Contains(const BlockHash& hash) const;

  // The checksum recorded at Commit for the stored (kValid/kPinned) block `hash`; nullopt when
  // the pool does not hold it (or is still filling it).
  std::optional<uint64_t> ChecksumOf(const BlockHash& hash) const;

  // Takes the stored block `hash` out of the pool: from now on Pin, Contains, ChecksumOf and
  // StoredHashes do not find it and Reserve may grant it again. An unpinned block's slot is
  // freed at once; a pinned one's when its last pin ends (a restore already holding it keeps
  // its copy). false when the pool does not hold `hash` as kValid/kPinned.
  bool Drop(const BlockHash& hash);

  // Hashes of every stored (kValid/kPinned) block. O(num_slots).
  std::vector<BlockHash> StoredHashes() const;

  // Drops `session`'s claims on `slots`: a reservation frees its slot, a pin is removed (the
  // block stays). Slots without such a claim are ignored. Returns the claims dropped.
  int Release(SessionId session, absl::Span<const DramSlot> slots);
  // Drops every claim of `session` (Detach). Returns the claims dropped. O(num_slots).
  int ReleaseSession(SessionId session);
  // Drops every claim whose lease ended at or before the clock's now. Returns their number.
  // O(num_slots): call it from a periodic task (e.g. every lease / 4), not per request.
  int ExpireClaims();

  // How many of the coldest blocks to move out now: 0 while occupancy (kWriting + kValid +
  // kPinned) is at or below high_watermark * num_slots, else occupancy - low_watermark *
  // num_slots (rounded down).
  int64_t BlocksToSpill() const;

  // Takes up to `max_blocks` of the least recently used unpinned kValid blocks out of the index
  // (they become kEvicting, coldest first). The caller copies them down, then FinishEviction.
  std::vector<EvictionCandidate> TakeEvictionCandidates(int64_t max_blocks);
  // Frees kEvicting slots (CHECKs the state).
  void FinishEviction(absl::Span<const DramSlot> slots);

  // Current state of `slot` (CHECKed in range).
  SlotState StateOf(DramSlot slot) const;

  DramPoolStats Stats() const;

 private:
  // A session's reservation or pin: who holds it and until when.
  struct Claim {
    SessionId session;
    absl::Time deadline;  // absl::InfiniteFuture() for kTierdSession
  };

  struct Slot {
    SlotState state = SlotState::kFree;  // kValid here also covers "pinned" (see pins)
    BlockHash hash;
    uint64_t checksum = 0;
    uint32_t hits = 0;
    std::vector<Claim> claims;  // kWriting: the one reservation; kValid: pins
    bool unbound = false;       // kWriting without a hash yet (not in index_)
    bool dropped = false;       // kValid taken out by Drop while pinned: freed at its last unpin
    // LRU list links (slot indices; kNone at the ends); linked only while kValid.
    uint32_t prev = kNone;
    uint32_t next = kNone;
  };

  static constexpr uint32_t kNone = kSlotNone;

  DramPool(DramPoolConfig config, Clock* clock, std::unique_ptr<tier_shm::ShmRegion> region);

  absl::Time DeadlineFor(SessionId session) const;
  void LinkMru(uint32_t slot) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Unlink(uint32_t slot) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FreeSlot(uint32_t slot) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A free slot made kWriting with `session`'s claim (the caller names or unbinds it); nullopt
  // when none is free.
  std::optional<uint32_t> TakeFreeSlotLocked(SessionId session) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Drops claims of `slot` matching `pred`; frees a reservation. Returns the number dropped.
  template <typename Pred>
  int DropClaims(uint32_t slot, Pred pred) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const DramPoolConfig config_;
  const int64_t slot_bytes_;
  Clock* const clock_;
  const std::unique_ptr<tier_shm::ShmRegion> region_;

  mutable absl::Mutex mu_;
  std::vector<Slot> slots_ ABSL_GUARDED_BY(mu_);
  std::vector<uint32_t> free_ ABSL_GUARDED_BY(mu_);  // stack of kFree slots
  // Hash -> slot for kWriting and kValid slots (kEvicting ones are no longer findable).
  absl::flat_hash_map<BlockHash, uint32_t> index_ ABSL_GUARDED_BY(mu_);
  uint32_t lru_head_ ABSL_GUARDED_BY(mu_) = kNone;  // most recently used
  uint32_t lru_tail_ ABSL_GUARDED_BY(mu_) = kNone;  // least recently used
  int64_t writing_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t valid_ ABSL_GUARDED_BY(mu_) = 0;   // kValid including pinned
  int64_t pinned_ ABSL_GUARDED_BY(mu_) = 0;  // kValid slots with at least one pin
  int64_t evicting_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t unbound_ ABSL_GUARDED_BY(mu_) = 0;   // kWriting slots with unbound set
  DramPoolStats totals_ ABSL_GUARDED_BY(mu_);  // only the *_total fields are used
};

}  // namespace pd::tierd
