// Parameters of the paged-attention op family: WriteKv, PrefillAttention, DecodeAttention.
// Plain structs shared by every backend (included by .cu files: keep them free of Abseil and
// glog). Activations (q, k, v, out) are f32; the KV pool is f32, bf16 or f16.
#pragma once

#include <cstdint>

#include "kernels/types.h"

namespace pd::kernels {

// Largest head_dim the attention ops accept (the CPU kernels keep per-row state on the stack).
inline constexpr int64_t kMaxAttentionHeadDim = 256;

// One layer's view of the KV block pool. The kernels take strides instead of the engine's
// struct, so any block layout with contiguous [token][head_dim] rows works. In elements of
// `dtype` from `base`, for physical block b, kv head h, token slot t in the block, element d:
//   K = b * block_stride + layer * layer_stride + h * head_stride + t * head_dim + d
//   V = the K offset + kv_stride
// DESIGN.md's layout ([layer][K|V][kv_head][token][head_dim] per block) is DenseKvCacheView.
struct KvCacheView {
  void* base = nullptr;  // the pool: num_blocks blocks
  DType dtype = DType::kF32;
  int64_t num_blocks = 0;  // physical blocks; block ids must lie in [0, num_blocks)
  int64_t block_size = 0;  // tokens per block
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;  // also the token stride
  int64_t block_stride = 0;
  int64_t layer_stride = 0;
  int64_t kv_stride = 0;  // K -> V of the same layer
  int64_t head_stride = 0;
  int64_t layer = 0;  // which layer this call reads or writes
};

// The DESIGN.md block layout: each block is [num_layers][2][num_kv_heads][block_size][head_dim].
constexpr KvCacheView DenseKvCacheView(void* base, DType dtype, int64_t num_blocks,
                                       int64_t num_layers, int64_t num_kv_heads, int64_t block_size,
                                       int64_t head_dim, int64_t layer) {
  KvCacheView v;
  v.base = base;
  v.dtype = dtype;
  v.num_blocks = num_blocks;
  v.block_size = block_size;
  v.num_kv_heads = num_kv_heads;
  v.head_dim = head_dim;
  v.head_stride = block_size * head_dim;
  v.kv_stride = num_kv_heads * v.head_stride;
  v.layer_stride = 2 * v.kv_stride;
  v.block_stride = num_layers * v.layer_stride;
  v.layer = layer;
  return v;
}

// Block tables: row s lists sequence s's physical block ids (int32) in logical order: token at
// position p lives in block table[s][p / block_size], slot p % block_size.

// Writes K and V of num_tokens tokens into the pool (f32 -> cache dtype, rounded as in
// kernels/half.h). Token j goes to position positions[j] of sequence token_seq[j].
struct WriteKvParams {
  const float* k = nullptr;  // [num_tokens][k_token_stride]; each token's [num_kv_heads][head_dim]
  const float* v = nullptr;  // [num_tokens][v_token_stride]; likewise
  int64_t k_token_stride = 0;  // >= num_kv_heads * head_dim, likewise below
  int64_t v_token_stride = 0;
  KvCacheView cache;
  int64_t num_tokens = 0;
  const int32_t* positions = nullptr;  // [num_tokens], >= 0
  // [num_tokens] row of block_tables for each token, or nullptr: every token is in row 0 (one
  // sequence, the prefill case). Batched decode passes 0..num_seqs-1.
  const int32_t* token_seq = nullptr;
  const int32_t* block_tables = nullptr;  // [num_seqs][max_blocks_per_seq]
  int64_t num_seqs = 1;
  int64_t max_blocks_per_seq = 0;
};

// Causal attention of num_tokens new tokens of ONE sequence at positions
// [start_pos, start_pos + num_tokens), whose K/V are already in the pool (WriteKv first). The
// query at position p attends keys 0..p read through block_table, so start_pos > 0 (a prefix
// cache hit or a later prefill chunk) reads the earlier tokens from their cached blocks.
// GQA: query head h reads kv head h / (num_heads / cache.num_kv_heads). Softmax in f32 with the
// running max subtracted; out = softmax(scale * q K^T) V.
struct PrefillAttentionParams {
  const float* q = nullptr;      // [num_tokens][q_token_stride]; each token's [num_heads][head_dim]
  float* out = nullptr;          // [num_tokens][out_token_stride]; likewise; must not overlap q
  int64_t q_token_stride = 0;    // >= num_heads * head_dim
  int64_t out_token_stride = 0;  // >= num_heads * head_dim
  KvCacheView cache;
  const int32_t* block_table = nullptr;  // [num_table_blocks]
  int64_t num_table_blocks = 0;          // >= ceil((start_pos + num_tokens) / block_size)
  int64_t start_pos = 0;
  int64_t num_tokens = 0;
  int64_t num_heads = 0;  // a multiple of cache.num_kv_heads
  float scale = 0.0f;     // 0 means 1 / sqrt(head_dim)
};

// One query token for each of num_seqs sequences (continuous batching): sequence s attends its
// keys [0, context_lens[s]), which include the current token (WriteKv first).
struct DecodeAttentionParams {
  const float* q = nullptr;    // [num_seqs][q_seq_stride]; each [num_heads][head_dim]
  float* out = nullptr;        // [num_seqs][out_seq_stride]; likewise; must not overlap q
  int64_t q_seq_stride = 0;    // >= num_heads * head_dim
  int64_t out_seq_stride = 0;  // >= num_heads * head_dim
  KvCacheView cache;
  const int32_t* block_tables = nullptr;  // [num_seqs][max_blocks_per_seq]
  int64_t max_blocks_per_seq = 0;
  const int32_t* context_lens = nullptr;  // [num_seqs], in [1, max_blocks_per_seq * block_size]
  int64_t num_seqs = 0;
  int64_t num_heads = 0;  // a multiple of cache.num_kv_heads
  float scale = 0.0f;     // 0 means 1 / sqrt(head_dim)
};

}  // namespace pd::kernels
