// BlockPool: the physical KV blocks of one worker pool, as bookkeeping only (no memory): block ids
// with reference counts, the prefix cache (BlockHash -> BlockId of committed full blocks), and the
// free and evictable lists that allocation draws from (docs/architecture.md, "KV layout").
//
// Every block is in exactly one state:
//   used       ref_count > 0; held by one or more block tables; may carry a hash.
//   free       ref_count == 0, no hash; on the free list; allocated first.
//   evictable  ref_count == 0 with a hash; on the LRU list (least recently released at the
//              front); still a prefix-cache hit until allocation evicts it.
//
// Allocation takes free blocks first, then evicts evictable blocks from the LRU front. Eviction
// calls the eviction hook (hash, block) synchronously before the block is handed out, so the
// DRAM tier can copy the block's contents away while they are intact, then drops the hash and
// reports OnBlocksRemoved.
//
// Most callers use KvCacheManager, which adds per-sequence block tables on top of this class.
//
// Thread-safety: thread-compatible. One owner (the scheduler thread) calls it; the listener and
// the eviction hook run on that thread.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/types/span.h"
#include "common/base/strong_id.h"
#include "common/hash/block_hash.h"
#include "engine/kvcache/kv_event_listener.h"

namespace pd::kvcache {

class BlockPool {
 public:
  // Called with the hash and id of a cached block right before the block is reused for other
  // contents. Runs on the caller's thread inside Allocate(); must not call into the pool.
  using EvictionHook = absl::AnyInvocable<void(const BlockHash& hash, BlockId block)>;
  // Called with the hash and id of each block Commit newly registers (not for duplicates or
  // blocks already holding the hash), after the listener heard of it: the block's KV is
  // computed. Runs on the caller's thread inside Commit(); must not call into the pool.
  // The worker's write-through to its node's tiers (--tier_write_through).
  using StoreHook = absl::AnyInvocable<void(const BlockHash& hash, BlockId block)>;

  // Largest pool: block ids are uint32 and the max value is BlockId::Invalid().
  static constexpr int64_t kMaxBlocks = int64_t{0xFFFFFFFF} - 1;

  // A pool of `num_blocks` free blocks, ids [0, num_blocks). `num_blocks` must be in
  // [1, kMaxBlocks] (CHECKed: validate configs first, see KvCacheConfig). `listener` (not owned,
  // may be null = no events) must outlive the pool; either hook may be null.
  BlockPool(int64_t num_blocks, KvEventListener* listener, EvictionHook hook,
            StoreHook store_hook = nullptr);

  BlockPool(const BlockPool&) = delete;
  BlockPool& operator=(const BlockPool&) = delete;

  int64_t num_blocks() const { return static_cast<int64_t>(blocks_.size()); }

  // Blocks an Allocate() can hand out now: free plus evictable.
  int64_t NumFreeBlocks() const { return static_cast<int64_t>(free_.size()) + num_evictable_; }
  bool CanAllocate(int64_t n) const { return n <= NumFreeBlocks(); }
  int64_t NumUnhashedFreeBlocks() const { return static_cast<int64_t>(free_.size()); }
  int64_t NumEvictableBlocks() const { return num_evictable_; }
  int64_t NumUsedBlocks() const { return num_blocks() - NumFreeBlocks(); }
  // Hashes currently cached (used or evictable).
  int64_t NumCachedHashes() const { return static_cast<int64_t>(hash_to_block_.size()); }
  // Blocks evicted (hash dropped for reuse) since construction.
  int64_t num_evictions() const { return num_evictions_; }

  // The block holding `hash`, or BlockId::Invalid() when it is not cached. Read-only.
  BlockId Lookup(const BlockHash& hash) const;
  // How many leading hashes of `chain` are cached, used or evictable. Read-only, takes no refs.
  int64_t MatchPrefix(absl::Span<const BlockHash> chain) const;

  // Takes a reference on cached block `block` (one returned by Lookup). An evictable block leaves
  // the LRU list and becomes used. CHECK-fails if `block` carries no hash.
  void AcquireCached(BlockId block);

  // Appends `n` blocks, each with ref_count 1 and no hash, to `*out`: free blocks first, then
  // evictable ones in LRU order (calling the eviction hook for each, then one OnBlocksRemoved
  // with all hashes evicted by this call). All-or-nothing: ResourceExhausted, with nothing
  // changed, when fewer than `n` blocks are allocatable; InvalidArgument when n < 0.
  absl::Status Allocate(int64_t n, std::vector<BlockId>* out);

  // Drops one reference. At zero a hashed block goes to the back (most recent end) of the LRU
  // list, an unhashed one to the free list. CHECK-fails if the block is not in use.
  void Release(BlockId block);

  // Registers hashes for used blocks whose KV is now computed: blocks[i] gets hashes[i].
  // `hashes` are consecutive blocks of one chain and `parent` is the hash before hashes[0]
  // (nullopt if hashes[0] starts the chain); `parent` is only passed on to the listener.
  //
  // Per block: already holding the same hash -> nothing; hash not cached -> registered (block
  // becomes a prefix-cache hit); hash already cached in ANOTHER block -> the existing mapping
  // is kept and this block stays unhashed (a duplicate: it serves its own sequence and goes to
  // the free list when released, never to the LRU). OnBlocksStored is emitted once per run of
  // consecutive newly registered hashes, with that run's parent.
  //
  // All-or-nothing: InvalidArgument if the spans differ in size; FailedPrecondition (nothing
  // changed) if a block is out of range, not in use, or already holds a different hash.
  absl::Status Commit(absl::Span<const BlockId> blocks, absl::Span<const BlockHash> hashes,
                      std::optional<BlockHash> parent);

  // Drops every hash (used blocks keep their refs but are no longer hits; evictable blocks move
  // to the free list) and emits OnAllCleared. The eviction hook is not called: this is for
  // contents that became invalid (e.g. weights reloaded), not for cold ones.
  void ResetPrefixCache();

  // Introspection (block must be in range, CHECKed).
  int32_t ref_count(BlockId block) const { return Get(block).ref_count; }
  std::optional<BlockHash> hash(BlockId block) const;
  bool IsEvictable(BlockId block) const { return Get(block).evictable; }
  // Evictable blocks from least to most recently released (the eviction order). O(evictable).
  std::vector<BlockId> EvictableBlocksInLruOrder() const;

  // Verifies every internal invariant (states partition the blocks, lists and counters agree,
  // the hash map and per-block hashes match). O(num_blocks). Internal error naming the first
  // violation; for tests and debugging.
  absl::Status CheckInvariants() const;

 private:
  static constexpr uint32_t kNil = 0xFFFFFFFF;

  struct Block {
    BlockHash hash;            // valid when has_hash
    uint32_t lru_prev = kNil;  // neighbours in the LRU list when evictable
    uint32_t lru_next = kNil;
    int32_t ref_count = 0;
    bool has_hash = false;
    bool evictable = false;  // linked in the LRU list (ref_count == 0 && has_hash)
  };

  const Block& Get(BlockId block) const;
  Block& Get(BlockId block);
  void LinkLruBack(uint32_t index);
  void UnlinkLru(uint32_t index);

  KvEventListener* const listener_;  // not owned; may be null
  EvictionHook eviction_hook_;       // may be null
  StoreHook store_hook_;             // may be null
  std::vector<Block> blocks_;
  std::vector<BlockId> free_;  // unhashed, ref 0; allocated from the back
  uint32_t lru_head_ = kNil;   // least recently released evictable block
  uint32_t lru_tail_ = kNil;   // most recently released evictable block
  int64_t num_evictable_ = 0;
  int64_t num_evictions_ = 0;
  absl::flat_hash_map<BlockHash, BlockId> hash_to_block_;
};

}  // namespace pd::kvcache
