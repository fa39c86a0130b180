// LlamaForward: the transformer forward pass over a paged KV cache, for a batch of sequences
// each bringing some new tokens (a prefill chunk, or one token when decoding).
//
// For each sequence the new tokens sit at positions [start_pos, start_pos + n); the KV of
// positions [0, start_pos) must already be in the pool (computed earlier, reused from the
// prefix cache, or written by a remote prefill worker), and the block table must cover
// [0, start_pos + n). Forward() writes the new tokens' K/V into the pool and returns the logits
// of each sequence's last new token.
//
// Exactness: every kernel computes a row independently of the other rows in the batch, so a
// sequence's logits do not depend on what it is batched with, on how its prompt is chunked, or
// on whether its prefix came from the cache (tested bitwise in llama_forward_test.cc).
//
// Thread-compatible: one caller at a time (the scheduler thread); kernels use ctx.parallel.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "engine/model/model_weights.h"
#include "kernels/attention_params.h"
#include "kernels/types.h"

namespace pd::engine {

// The KV block pool the forward pass reads and writes: DESIGN.md layout
// ([layer][K|V][kv_head][token][head_dim] per block), `num_blocks` blocks from `base`.
struct KvPoolView {
  void* base = nullptr;
  kernels::DType dtype = kernels::DType::kF32;
  int64_t num_blocks = 0;
  int64_t block_size = 16;
};

struct ForwardSequence {
  absl::Span<const uint32_t> tokens;      // the new tokens, >= 1
  int64_t start_pos = 0;                  // position of tokens[0]
  absl::Span<const int32_t> block_table;  // physical blocks covering [0, start_pos + n)
};

struct ForwardOptions {
  int64_t max_batch_tokens = 256;  // bound on the sum of new tokens per Forward() call
  int64_t max_seqs = 64;           // bound on sequences per call
};

class LlamaForward {
 public:
  // `weights` must outlive the object; the pool must match the model (num_kv_heads, head_dim
  // and layers come from weights->config). InvalidArgument for inconsistent geometry;
  // Unimplemented when a kernel does not support the weight or cache dtype on ctx.device.
  static absl::StatusOr<std::unique_ptr<LlamaForward>> Create(const ModelWeights* weights,
                                                              KvPoolView pool,
                                                              kernels::OpContext ctx,
                                                              ForwardOptions options);

  // Runs the batch; `logits` is [batch.size()][vocab_size()]. Errors found before any compute
  // (the pool is then untouched): InvalidArgument for an empty sequence, a token id >= vocab, a
  // block table that does not cover the sequence or names a block outside the pool, too many tokens
  // or sequences for the options; OutOfRange when a position reaches the model's context length.
  absl::Status Forward(absl::Span<const ForwardSequence> batch, float* logits);

  int64_t vocab_size() const { return config_.vocab_size; }
  const ForwardOptions& options() const { return options_; }
  const ModelConfig& config() const { return config_; }
  // Bytes of one KV block of this model at the pool's dtype.
  int64_t block_bytes() const;

 private:
  LlamaForward(const ModelWeights* weights, KvPoolView pool, kernels::OpContext ctx,
               ForwardOptions options);
  absl::Status Validate(absl::Span<const ForwardSequence> batch) const;
  absl::Status Layer(int layer, int64_t num_tokens);
  absl::Status MatMul(const float* x, const void* w, const float* bias, float* y, int64_t num_rows,
                      int64_t in, int64_t out, bool accumulate);
  kernels::KvCacheView CacheView(int layer) const;

  const ModelWeights* weights_;
  const ModelConfig& config_;
  const KvPoolView pool_;
  const kernels::OpContext ctx_;
  const ForwardOptions options_;
  std::vector<float> inv_freq_;

  // Per-call layout of the batch. Single-token sequences come first (contiguous, one
  // DecodeAttention call for all of them), then multi-token ones (one PrefillAttention each).
  struct Slot {
    int64_t batch_index;  // index into the caller's batch
    int64_t first_token;  // row of its first new token in the activation buffers
    int64_t num_tokens;
    int64_t start_pos;
  };
  std::vector<Slot> slots_;
  int64_t num_decode_slots_ = 0;

  // Scratch, sized for options_.max_batch_tokens rows (activations) / max_seqs (tables).
  std::vector<float> x_, xb_, q_, k_, v_, att_, gate_, up_;
  std::vector<int32_t> positions_, token_seq_, block_tables_, context_lens_;
  int64_t max_blocks_per_seq_ = 0;
  std::vector<float> logits_tmp_;  // [max_seqs][vocab], slot order
  std::vector<uint8_t> workspace_;
};

}  // namespace pd::engine
