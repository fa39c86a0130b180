// KvCacheManager: the paged KV cache bookkeeping of one worker (issue #3 item 4): per-sequence
// block tables over a BlockPool with reference counts and prefix caching by block-hash chain.
// No memory and no device here: the data of block b lives wherever the pool's memory is
// (engine/memory HostKvPool::BlockData(b), or device memory).
//
// Life of a sequence (colocated):
//   AllocatePrompt(seq, chain, n)   -> cached tokens c; prefill computes tokens [c, n)
//   CommitBlocks(seq, chain)        after the KV of those full blocks is written
//   AppendTokens(seq, 1) per decode step; CommitBlocks(seq, extended chain) when a block fills
//   Free(seq)                       finished, cancelled or preempted (re-admit = AllocatePrompt)
//
// Disaggregated: the decode worker calls ImportBlocks (AllocatePrompt plus the ids of the
// destination blocks to hand to the prefill worker), then CommitBlocks once the remote write
// has completed, or Free if it failed (uncommitted blocks never become hits). The prefill worker
// runs the colocated path and sends ExportBlocks(seq, first, count).
//
// `chain` arguments are the block-hash chain of the sequence's tokens (common/hash
// ComputeBlockHashes / ExtendBlockHashes), one hash per full block from block 0.
//
// Errors: InvalidArgument for malformed arguments, NotFound for an unknown sequence,
// AlreadyExists for a sequence allocated twice, ResourceExhausted when blocks run out (nothing
// changed: admission control and preemption rely on it), FailedPrecondition for a commit that
// contradicts an earlier one.
//
// Thread-safety: thread-compatible; owned and called by the scheduler thread. The event
// listener and eviction hook run on that thread, inside the call that caused them.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/base/strong_id.h"
#include "common/hash/block_hash.h"
#include "engine/kvcache/block_pool.h"
#include "engine/kvcache/block_table.h"
#include "engine/kvcache/kv_event_listener.h"

namespace pd::kvcache {

struct KvCacheConfig {
  int64_t num_blocks = 0;   // physical blocks in the pool, [1, BlockPool::kMaxBlocks]
  int64_t block_size = 16;  // tokens per block, > 0; must equal the KvLayout's block_size

  // InvalidArgument naming the field when out of range.
  absl::Status Validate() const;
};

// Snapshot of a KvCacheManager (TRT-LLM KvCacheStats-like). Block counts partition the pool:
// num_blocks_free + num_blocks_cached + num_blocks_used == num_blocks_total. Counters are
// cumulative since creation.
struct KvCacheStats {
  int64_t num_blocks_total = 0;
  int64_t num_blocks_free = 0;    // ref 0, no hash: allocated first
  int64_t num_blocks_cached = 0;  // ref 0 with a hash: evictable LRU, still prefix hits
  int64_t num_blocks_used = 0;    // ref > 0 (held by at least one sequence)
  int64_t num_cached_hashes = 0;  // hashes that can hit now (used or cached blocks)
  int64_t num_sequences = 0;      // live block tables

  int64_t prefix_queries = 0;       // successful AllocatePrompt / ImportBlocks calls
  int64_t prefix_query_tokens = 0;  // prompt tokens of those calls
  int64_t prefix_hit_blocks = 0;    // blocks reused from the prefix cache by those calls
  int64_t prefix_hit_tokens = 0;    // = prefix_hit_blocks * block_size
  int64_t evictions = 0;            // cached blocks evicted for reuse (eviction hook calls)
  int64_t allocation_failures = 0;  // calls that returned ResourceExhausted
};

// What a decode worker hands to the prefill worker for a disaggregated prompt.
struct ImportTarget {
  int64_t num_cached_tokens = 0;   // tokens already cached locally (not to be sent)
  int64_t first_block = 0;         // logical index of block_ids[0] (= cached tokens/block_size)
  std::vector<BlockId> block_ids;  // destination blocks for logical blocks [first_block, end)
};

class KvCacheManager {
 public:
  // `listener` (may be null: no events) must outlive the manager. `eviction_hook` (may be
  // null) runs before a cached block is reused (BlockPool::EvictionHook); `store_hook` (may be
  // null) after a block is newly committed (BlockPool::StoreHook). InvalidArgument when
  // `config` is invalid.
  static absl::StatusOr<std::unique_ptr<KvCacheManager>> Create(
      const KvCacheConfig& config, KvEventListener* listener = nullptr,
      BlockPool::EvictionHook eviction_hook = nullptr, BlockPool::StoreHook store_hook = nullptr);

  KvCacheManager(const KvCacheManager&) = delete;
  KvCacheManager& operator=(const KvCacheManager&) = delete;

  int64_t block_size() const { return block_size_; }
  int64_t num_blocks() const { return pool_.num_blocks(); }
  // Blocks needed to hold `num_tokens` tokens: ceil(num_tokens / block_size).
  int64_t NumBlocksForTokens(int64_t num_tokens) const;

  // Blocks allocatable now (free plus cached/evictable), and whether `num_blocks` of them are.
  int64_t NumFreeBlocks() const { return pool_.NumFreeBlocks(); }
  bool CanAllocate(int64_t num_blocks) const { return pool_.CanAllocate(num_blocks); }

  // How many leading blocks of `chain` are cached here (used or evictable). Read-only: takes no
  // references and updates no statistics (router scoring, prefill planning).
  int64_t Match(absl::Span<const BlockHash> chain) const { return pool_.MatchPrefix(chain); }

  // Creates `seq`'s table for a prompt of `num_prompt_tokens` (> 0) tokens whose full blocks
  // hash to `chain` (at most num_prompt_tokens / block_size hashes; fewer, e.g. none, limits
  // reuse to those). Reuses the longest cached prefix of `chain` (taking references; an
  // evictable hit leaves the LRU), capped so that at least one prompt token is left to compute
  // (the model needs the last token's logits, and that token's block must be private: a prompt
  // fully cached up to a block boundary recomputes its last block). Allocates fresh blocks for
  // the rest, including a trailing partial block.
  // Returns the number of cached tokens, a multiple of block_size and < num_prompt_tokens.
  // All-or-nothing: ResourceExhausted (nothing changed) when the fresh blocks do not fit.
  absl::StatusOr<int64_t> AllocatePrompt(SequenceId seq, absl::Span<const BlockHash> chain,
                                         int64_t num_prompt_tokens);

  // Decode side of a disaggregated prefill: AllocatePrompt, and the blocks the remote prefill
  // must write (every block after the cached prefix, incl. the trailing partial one). Until
  // CommitBlocks those blocks are private to `seq`; Free(seq) after a failed transfer returns
  // them to the free list, never to the prefix cache. Errors as AllocatePrompt.
  absl::StatusOr<ImportTarget> ImportBlocks(SequenceId seq, absl::Span<const BlockHash> chain,
                                            int64_t num_prompt_tokens);

  // Decode side of a SnapKV prompt compressed by the prefill worker (compress_policy.h):
  // `seq`'s table of `num_kept_tokens` (> 0) tokens in fresh private blocks, all to be written
  // remotely, windowed() from the start (its slots are not the text's positions, so nothing of
  // it is ever committed). Errors as AllocatePrompt.
  absl::StatusOr<ImportTarget> ImportCompressedBlocks(SequenceId seq, int64_t num_kept_tokens);

  // Blocks `seq` must allocate to grow by `num_tokens` tokens (0 while the last block has room).
  // NotFound for an unknown sequence.
  absl::StatusOr<int64_t> BlocksNeededToAppend(SequenceId seq, int64_t num_tokens) const;

  // Grows `seq` by `num_tokens` (>= 0) token slots, allocating blocks as the last one fills.
  // ResourceExhausted (nothing changed) when out of blocks: the scheduler then preempts.
  absl::Status AppendTokens(SequenceId seq, int64_t num_tokens);

  // Registers the hashes of `seq`'s leading full blocks whose KV has been written, making them
  // shareable (BlockPool::Commit: a hash already cached in another block keeps that block, and
  // this one stays a private duplicate). `chain` covers blocks from 0 and may be longer each
  // call (blocks before num_committed_blocks() are skipped, so repeating a call is free).
  // InvalidArgument if `chain` is longer than the sequence's full blocks; FailedPrecondition if
  // a block already holds a different hash, or when the table is windowed(). Emits
  // OnBlocksStored for newly cached hashes.
  absl::Status CommitBlocks(SequenceId seq, absl::Span<const BlockHash> chain);

  // Sink + window KV policy (the scheduler's --kv_sink_tokens / --kv_window_tokens).
  //
  // ForkLeadingBlocks: moves the first `num_blocks` blocks of `seq`'s table aside (they stay
  // referenced, unchanged, and are released by Free) and puts that many fresh private blocks in
  // their place; returns the fresh ones, in order (the caller fills them). The table becomes
  // windowed(). InvalidArgument unless 0 < num_blocks < the table's blocks, those blocks are
  // full, and nothing was set aside before; ResourceExhausted (nothing changed) when the fresh
  // blocks do not fit.
  absl::StatusOr<std::vector<BlockId>> ForkLeadingBlocks(SequenceId seq, int64_t num_blocks);
  // DropBlock: removes logical block `index` (full, and not the last) from `seq`'s table and
  // releases its reference (a hashed block at ref 0 stays a prefix-cache entry, at the back
  // of the LRU); later blocks move down one index and the table holds block_size fewer tokens.
  // The table becomes windowed(). InvalidArgument for an index outside [0, blocks - 1) or a
  // block that is not full.
  absl::Status DropBlock(SequenceId seq, int64_t index);

  // Compressing KV policies (H2O, SnapKV: engine/scheduler/compress_policy.h).
  //
  // ReplaceBlocks: allocates ceil(num_tokens / block_size) fresh private blocks, calls
  // `fill(old, fresh)` (`seq`'s current blocks in logical order, all still referenced, and the
  // fresh ones) to write what the sequence keeps into them, then makes the fresh blocks the
  // table, holding `num_tokens` tokens, and releases the old ones (a hashed block at ref 0 stays
  // a prefix-cache entry: it still holds the full prefix's KV). The table becomes windowed().
  // InvalidArgument unless 0 < num_tokens <= the table's tokens and nothing was set aside;
  // ResourceExhausted (nothing changed) when the fresh blocks do not fit; a failing `fill`'s
  // status (the fresh blocks freed, nothing else changed).
  using BlockFiller = absl::FunctionRef<absl::Status(absl::Span<const BlockId> old,
                                                     absl::Span<const BlockId> fresh)>;
  absl::Status ReplaceBlocks(SequenceId seq, int64_t num_tokens, BlockFiller fill);

  // Drops `seq`'s table and its references, last block first: hashed blocks reaching ref 0 go to
  // the back of the LRU (so a chain's tail is evicted before its head, which keeps the rest
  // of the chain matchable), unhashed ones to the free list. NotFound for an unknown sequence.
  absl::Status Free(SequenceId seq);

  // Block ids of `seq`'s logical blocks [first_block, first_block + num_blocks), for the
  // transfer layer. OutOfRange when the range exceeds the table; NotFound for an unknown seq.
  absl::StatusOr<std::vector<BlockId>> ExportBlocks(SequenceId seq, int64_t first_block,
                                                    int64_t num_blocks) const;

  // `seq`'s table, or nullptr. Valid until the next non-const call on the manager.
  const BlockTable* GetTable(SequenceId seq) const;
  int64_t num_sequences() const { return static_cast<int64_t>(tables_.size()); }
  // Calls `fn` for every live sequence, in unspecified order.
  void ForEachSequence(absl::FunctionRef<void(SequenceId, const BlockTable&)> fn) const;

  // Drops every cached hash (BlockPool::ResetPrefixCache); live sequences keep their blocks.
  void ResetPrefixCache() { pool_.ResetPrefixCache(); }

  KvCacheStats Stats() const;
  const BlockPool& pool() const { return pool_; }

 private:
  KvCacheManager(const KvCacheConfig& config, KvEventListener* listener,
                 BlockPool::EvictionHook eviction_hook, BlockPool::StoreHook store_hook);

  // Argument checks of AllocatePrompt (its InvalidArgument and AlreadyExists cases).
  absl::Status ValidatePrompt(SequenceId seq, absl::Span<const BlockHash> chain,
                              int64_t num_prompt_tokens) const;
  // Looks up `seq`: NotFound naming it when absent.
  absl::StatusOr<BlockTable*> FindTable(SequenceId seq);
  absl::StatusOr<const BlockTable*> FindTable(SequenceId seq) const;

  const int64_t block_size_;
  BlockPool pool_;
  absl::flat_hash_map<SequenceId, BlockTable> tables_;
  KvCacheStats counters_;  // only the cumulative counters are maintained here
};

}  // namespace pd::kvcache
