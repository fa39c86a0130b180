// Sink + window KV policy (opt-in: kv_window_tokens > 0; StreamingLLM, Xiao et al. 2023).
//
// A sequence keeps its first S = ceil(kv_sink_tokens / block_size) blocks (the attention sinks),
// its last W = ceil(kv_window_tokens / block_size) full blocks and the block being filled:
// before the first token of a new block is computed with S + W + 1 blocks held, block S (the
// oldest after the sinks) is dropped. Every token of text block k therefore attends to the
// sinks, text blocks max(S, k - W) .. k - 1 and its own block up to itself, so a sequence
// generates past the model's context with at most S + W + 1 (+ S, below) blocks. Positions are
// StreamingLLM's, positions inside the cache: the query at cache slot c sees a sink key at slot
// s < S * block_size at distance c - s and a window key at its own slot distance. Realised
// without re-rotating the window: new tokens take RoPE position slot + dropped tokens (= their
// text position; RoPE scores depend only on the distance, which is the same inside the window),
// and the sinks are live copies of their original blocks rotated by the dropped tokens
// (LlamaForward::CopyBlocksShifted) after each drop; the originals stay held, so a sink key is
// rotated once from its original, never cumulatively. A prompt longer than the S + W + 1
// blocks is prefilled one block per chunk past that point, with the drops between, so a
// preempted sequence recomputes exactly what decoding computed. Blocks written before the
// first drop go to the prefix cache as usual; none after it (their KV depends on dropped
// context). A prompt that needs a drop is prefilled locally (never remote_prefill), and a
// prefill-only request must fit without one. Every device (on kCuda compiled and tested on the
// CPU through ForwardOptions::staged_metadata; not yet run on a GPU).
//
// WindowPolicy holds S and W and does the drops on a KvCacheManager; the scheduler decides when
// (it owns preemption and the batch). Thread-compatible value type.
#pragma once

#include <cstdint>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "engine/kvcache/kv_cache_manager.h"

namespace pd::engine {

class WindowPolicy {
 public:
  // Rebuilds the live sink copies after a drop: copies the first `num_tokens` token rows of the
  // blocks `originals` into the blocks `live` (pool block ids, one per sink block, in order),
  // rotating their keys forward by `shift` RoPE positions (LlamaForward::CopyBlocksShifted).
  using SinkCopier = absl::FunctionRef<absl::Status(absl::Span<const int32_t> originals,
                                                    absl::Span<const int32_t> live,
                                                    int64_t num_tokens, int64_t shift)>;

  // The policy off: nothing is ever dropped.
  WindowPolicy() = default;

  // InvalidArgument (naming both values) when a count is negative or sinks come without a
  // window. Both 0 is valid (off).
  static absl::Status ValidateTokens(int64_t sink_tokens, int64_t window_tokens);

  // Rounds both counts up to whole blocks of `block_size` tokens (> 0). InvalidArgument as
  // ValidateTokens, or when the S + W + 1 blocks exceed the model's `context_tokens`.
  static absl::StatusOr<WindowPolicy> Create(int64_t sink_tokens, int64_t window_tokens,
                                             int64_t block_size, int64_t context_tokens);

  bool enabled() const { return window_blocks_ > 0; }
  int64_t sink_blocks() const { return sink_blocks_; }      // S
  int64_t window_blocks() const { return window_blocks_; }  // W; 0 = off

  // Tokens a sequence may hold in the cache at once: (S + W + 1) * block_size; the largest
  // int64_t when off.
  int64_t CacheCapTokens() const;

  // The most blocks a sequence holds that would need `unbounded_blocks` without the policy:
  // at most S + W + 1 plus the S sink copies made at the first drop.
  int64_t MaxBlocks(int64_t unbounded_blocks) const;

  // A prefill-only request's blocks are sent whole, so its prompt must fit without a drop:
  // InvalidArgument naming `request_id` when `prompt_tokens` exceed CacheCapTokens().
  absl::Status CheckPrefillOnly(absl::string_view request_id, int64_t prompt_tokens) const;

  // Whether the model's context bounds a sequence's length: always without the policy; with it
  // only when the request set no max_tokens (0 = the context, as without the policy).
  bool ContextBoundsLength(uint32_t max_tokens) const { return !enabled() || max_tokens == 0; }

  // Drops the oldest window block (logical index S) of sequence `seq` in `kv` and adds
  // block_size to `*dropped_tokens` (the sequence's dropped text tokens). At the first drop
  // (`*dropped_tokens` == 0) the sinks are forked first: their originals are set aside and live
  // copies take their place; after each drop `copy_sinks` rebuilds the live copies rotated by
  // the new `*dropped_tokens`. Precondition: the table holds S + W + 1 blocks, all computed.
  // ResourceExhausted (nothing changed) when the sink copies do not fit the pool; Internal
  // when `copy_sinks` fails (the block is dropped then).
  absl::Status Slide(kvcache::KvCacheManager* kv, kvcache::SequenceId seq, int64_t* dropped_tokens,
                     SinkCopier copy_sinks);

  // Blocks dropped by Slide so far (cumulative).
  int64_t num_dropped_blocks() const { return num_dropped_blocks_; }

 private:
  WindowPolicy(int64_t sink_blocks, int64_t window_blocks, int64_t block_size)
      : sink_blocks_(sink_blocks), window_blocks_(window_blocks), block_size_(block_size) {}

  int64_t sink_blocks_ = 0;
  int64_t window_blocks_ = 0;
  int64_t block_size_ = 0;
  int64_t num_dropped_blocks_ = 0;
};

}  // namespace pd::engine
