// KvIndex: the router's live map of which worker holds which KV block in which tier, folded from
// the workers' KV event streams (proto/pd/v1/kv_events.proto; docs/architecture.md, "KV events")
// and read on every request to score workers by the prefix they already hold
// (docs/architecture.md, "Router scoring").
//
// The unit is an entry: one (worker, block hash, tier) triple. A block held by a worker in HBM
// and DRAM is two entries; the same block held by two workers is two entries.
//
// Memory bound: at most KvIndexConfig::max_blocks entries. Adding an entry to a full index first
// evicts the least recently stored (worker, block) pair, with all of its tiers (so one eviction
// may drop up to three entries), and counts the entries dropped in Stats().evictions. "Stored"
// means a BlockStored event or snapshot run naming the pair (any tier), so recency is kept per
// (worker, block) pair, not per tier: that is the approximation. A run of blocks is stored last
// block first, so within one event the chain's tail is older than its head and the bound cuts
// chains from the end, keeping their prefixes matchable. Evicting loses only routing quality
// (the worker still holds the block and still reuses it), never correctness.
// Memory: ~110 bytes per entry (hash map slot, LRU node, holder arrays of shared blocks;
// measured by routing_bench at 1.1M entries), so the default bound is ~450 MB.
//
// Thread-safety: thread-safe. Match and Stats take a reader lock and run concurrently with each
// other. Apply and RemoveWorker take the writer lock; every 32 blocks they check for readers
// waiting and, if there are any, let them in before going on, so a large snapshot or worker
// drop never stalls a reader for more than a few microseconds of work. A reader may therefore
// observe a batch half-applied (the index is a routing hint, not a source of truth). Calls to
// Apply for one worker must come in stream order from one thread at a time (a subscriber's
// thread); calls for different workers may run concurrently.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "common/hash/block_hash.h"
#include "pd/v1/kv_events.pb.h"

namespace pd::router {

// The router's automatic bound (--index_max_blocks=0) for workers whose pools hold
// `total_pool_blocks` blocks together: two entries per block (a pool block and one lower tier),
// at least kAutoIndexMinBlocks.
inline constexpr int64_t kAutoIndexMinBlocks = 1'000'000;
inline constexpr int64_t kAutoIndexEntriesPerBlock = 2;
inline int64_t AutoIndexBound(int64_t total_pool_blocks) {
  return std::max(kAutoIndexMinBlocks, total_pool_blocks * kAutoIndexEntriesPerBlock);
}

struct KvIndexConfig {
  // Bound on the number of (worker, block, tier) entries held; > 0. See the file comment for
  // what happens at the bound.
  int64_t max_blocks = 4'000'000;

  // InvalidArgument naming the field when max_blocks <= 0.
  absl::Status Validate() const;
};

// How much of a block-hash chain one worker holds, as counted by KvIndex::Match.
struct WorkerOverlap {
  std::string worker_id;
  // Leading blocks of the chain held in the worker's own pool (G1), stopping at the first block
  // it does not hold there.
  int64_t hbm_blocks = 0;
  // After those, the contiguous continuation of blocks held in a lower tier of the worker's
  // node: a block in DRAM counts here, a block only in NVMe counts in nvme_blocks. The
  // continuation stops at the first block held in neither DRAM nor NVMe.
  int64_t dram_blocks = 0;
  int64_t nvme_blocks = 0;

  // Leading blocks the worker can reuse from any tier.
  int64_t total_blocks() const { return hbm_blocks + dram_blocks + nvme_blocks; }
};

// A snapshot of KvIndex counters; plain values, consistent with each other.
struct KvIndexStats {
  int64_t entries = 0;           // (worker, block, tier) entries held now
  int64_t blocks = 0;            // distinct block hashes held by at least one worker now
  int64_t workers = 0;           // workers known now (seen in Apply, not removed)
  int64_t evictions = 0;         // entries dropped by the max_blocks bound, since creation
  int64_t max_blocks = 0;        // the bound now
  int64_t events_applied = 0;    // KvEvents applied, since creation
  int64_t snapshot_chunks = 0;   // snapshot chunks (batches with a snapshot) applied
  int64_t rejected_batches = 0;  // Apply calls that returned an error
};

class KvIndex {
 public:
  // InvalidArgument when `config` is invalid.
  static absl::StatusOr<std::unique_ptr<KvIndex>> Create(KvIndexConfig config);

  KvIndex(const KvIndex&) = delete;
  KvIndex& operator=(const KvIndex&) = delete;
  ~KvIndex();

  // Folds one batch of `worker_id`'s event stream into the index.
  //
  // Snapshot chunks: the first chunk of a snapshot (a chunk whose (batch.epoch,
  // snapshot.sequence) differs from the snapshot in progress for the worker, or any chunk when
  // none is in progress) drops everything known about the worker; every chunk then adds its
  // blocks; the chunk with `complete` ends the snapshot. Then `events` apply in order: stored
  // adds each hash in its tier (and refreshes its recency), removed erases each hash from that
  // tier (unknown hashes are ignored), cleared drops every entry of the worker.
  //
  // The whole batch is validated before anything is applied. Errors:
  //  - InvalidArgument (naming the worker and the field, e.g. "events[2].stored.block_hashes"):
  //    empty worker_id; batch.worker_id or an event's worker_id set and different from
  //    worker_id; a hash string whose length is not a multiple of 16; a parent_hash that is
  //    neither empty nor 16 bytes; a tier that is TIER_UNSPECIFIED or unknown; an event with
  //    nothing set; events in a snapshot chunk that is not the last.
  //  - FailedPrecondition: a batch carrying events while a snapshot of the worker is
  //    incomplete (the stream broke mid-snapshot: resubscribe from 0).
  //  - ResourceExhausted: 65535 workers already known.
  //  - Aborted: RemoveWorker(worker_id) ran while the batch was being applied; the rest of the
  //    batch was dropped with the worker.
  // On InvalidArgument, FailedPrecondition and ResourceExhausted nothing was applied.
  absl::Status Apply(absl::string_view worker_id, const pdserve::internal::v1::KvEventBatch& batch);

  // Forgets `worker_id` (dead or left the pool): its entries and any snapshot in progress. No-op
  // for an unknown worker. Call it once the worker's subscriber no longer calls Apply, or a
  // late batch brings the worker back.
  void RemoveWorker(absl::string_view worker_id);

  // For each worker holding chain[0] in any tier, how many leading blocks of `chain` it holds
  // (see WorkerOverlap). Workers holding nothing of the chain are omitted; the order is
  // unspecified. Empty `chain` -> empty result. Cost: one hash lookup per block until no worker
  // still matches, plus the holders of each block walked.
  std::vector<WorkerOverlap> Match(absl::Span<const BlockHash> chain) const;

  KvIndexStats Stats() const;

  // Raises the entry bound to `max_blocks` (no effect when it is not above the current one):
  // the router's automatic bound grows as workers report their pool sizes.
  void RaiseMaxBlocks(int64_t max_blocks);

 private:
  // One (worker, block) pair: its tiers and its place in the LRU list and the worker's list.
  struct Node;
  // One worker holding a block: what Match reads. Indexes into nodes_.
  struct Holder {
    uint32_t node;
    uint16_t worker;
    uint8_t tiers;  // bit set of kTierBit*
  };
  // The holders of one block: the first inline, more in a heap array. 16 bytes, so that a map
  // slot (hash + holders) is 32 bytes and never straddles a cache line: Match is bound by the
  // cache misses of its lookups. Move-only.
  class Holders {
   public:
    Holders() : one_{} {}
    Holders(const Holders&) = delete;
    Holders& operator=(const Holders&) = delete;
    Holders(Holders&& other) noexcept;
    Holders& operator=(Holders&& other) noexcept;
    ~Holders();

    Holder* begin() { return capacity_ > 1 ? many_ : &one_; }
    Holder* end() { return begin() + size_; }
    const Holder* begin() const { return capacity_ > 1 ? many_ : &one_; }
    const Holder* end() const { return begin() + size_; }
    size_t size() const { return size_; }
    bool empty() const { return size_ == 0; }
    Holder& operator[](size_t i) { return begin()[i]; }
    Holder& back() { return begin()[size_ - 1]; }
    void push_back(const Holder& holder);
    void pop_back() { --size_; }

   private:
    union {
      Holder one_;    // capacity_ == 1
      Holder* many_;  // capacity_ > 1: owned, from std::allocator<Holder>
    };
    uint32_t size_ = 0;
    uint32_t capacity_ = 1;
  };
  struct WorkerSlot;
  class WriteSection;
  class ReadSection;

  explicit KvIndex(KvIndexConfig config);

  absl::StatusOr<uint16_t> InternLocked(absl::string_view worker_id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void AddEntryLocked(uint16_t worker, const BlockHash& hash, uint8_t tier_bit)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RemoveEntryLocked(uint16_t worker, const BlockHash& hash, uint8_t tier_bit)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Drops the holder of `node` (all its tiers); returns the entries dropped.
  int DropNodeLocked(uint32_t node) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Drops every entry of `worker`, yielding the lock through `section` on the way. false when
  // the worker was removed meanwhile.
  bool DropWorkerEntriesLocked(WriteSection& section, uint16_t worker)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Adds a run of concatenated 16-byte hashes; false when the worker was removed meanwhile.
  bool AddRunLocked(WriteSection& section, uint16_t worker, absl::string_view hashes,
                    uint8_t tier_bit) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool RemoveRunLocked(WriteSection& section, uint16_t worker, absl::string_view hashes,
                       uint8_t tier_bit) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  uint32_t AllocNodeLocked(const BlockHash& hash, uint16_t worker)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FreeNodeLocked(uint32_t node) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void LruUnlinkLocked(uint32_t node) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void LruPushBackLocked(uint32_t node) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const KvIndexConfig config_;
  mutable absl::Mutex mu_;
  int64_t max_blocks_ ABSL_GUARDED_BY(mu_);  // config_.max_blocks, raised by RaiseMaxBlocks
  // Readers blocked on mu_ (see ReadSection); a long write yields to them.
  mutable std::atomic<int> readers_waiting_{0};
  absl::flat_hash_map<BlockHash, Holders> blocks_ ABSL_GUARDED_BY(mu_);
  std::vector<Node> nodes_ ABSL_GUARDED_BY(mu_);
  uint32_t free_nodes_ ABSL_GUARDED_BY(mu_);  // singly linked through Node::lru_next
  uint32_t lru_head_ ABSL_GUARDED_BY(mu_);    // least recently stored
  uint32_t lru_tail_ ABSL_GUARDED_BY(mu_);    // most recently stored
  std::vector<WorkerSlot> slots_ ABSL_GUARDED_BY(mu_);
  std::vector<uint16_t> free_slots_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, uint16_t> slot_by_id_ ABSL_GUARDED_BY(mu_);
  int64_t entries_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t evictions_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t events_applied_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t snapshot_chunks_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t rejected_batches_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace pd::router
