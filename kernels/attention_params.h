// Parameters of the paged-attention op family: WriteKv, PrefillAttention, DecodeAttention.
// Plain structs shared by every backend (included by .cu files: keep them free of Abseil and
// glog). Activations (q, k, v, out) are f32; the KV pool is f32, bf16, f16, or one of the
// quantized dtypes i8 and fp8 E4M3.
//
// Quantized KV caches (IsQuantizedKvDType): each (token, kv head) row of head_dim values is
// stored as head_dim 1-byte codes plus one f32 scale, so a token's bytes depend only on its own
// K/V values (chunked prefill, prefix-cache hits, disaggregated prefill and restores all produce
// the same bytes). The scales live inside the block (see KvCacheView), so a block stays one
// contiguous extent of bytes. WriteKv quantizes a row x[0, head_dim) as follows (float
// arithmetic, each expression a single operation so no FMA contraction can change it; the
// reference, CPU and CUDA backends produce identical bytes):
//   if any x[d] is NaN or +-inf:  scale = NaN, q[d] = 0 (the row reads back as NaN, as an f32
//                                 cache holding the NaN would poison attention)
//   amax = max_d |x[d]|
//   if amax == 0:                 scale = 0, q[d] = 0
//   i8:   scale = amax / 127.0f, inv = 127.0f / amax,
//         q[d] = clamp(nearbyint(x[d] * inv), -127, 127)   (round half to even; -128 unused)
//   fp8:  scale = amax / 448.0f, inv = 448.0f / amax,
//         q[d] = F32ToE4M3(x[d] * inv)                     (kernels/half.h: RNE, saturating)
// Attention dequantizes on the fly in f32: value = decode(q[d]) * scale, where decode is
// static_cast<float>(int8_t) for i8 and E4M3ToF32 for fp8.
#pragma once

#include <cstdint>

#include "kernels/types.h"

namespace pd::kernels {

// Largest head_dim the attention ops accept (the CPU kernels keep per-row state on the stack).
inline constexpr int64_t kMaxAttentionHeadDim = 256;

// One layer's view of the KV block pool. The kernels take strides instead of the engine's
// struct, so any block layout with contiguous [token][head_dim] rows works. In elements of
// `dtype` from `base` (for the quantized dtypes an element is one byte), for physical block b,
// kv head h, token slot t in the block, element d:
//   K = b * block_stride + layer * layer_stride + h * head_stride + t * head_dim + d
//   V = the K offset + kv_stride
// Quantized dtypes only: the f32 scale of row (b, h, t) is at BYTE offset
//   b * block_stride + scale_offset + 4 * (layer * scale_layer_stride + h * scale_head_stride + t)
// for K, plus 4 * scale_kv_stride for V (scale strides in floats, token stride 1). The scale
// region must not overlap the layer's data and must be 4-byte aligned (base, block_stride and
// scale_offset multiples of 4).
// The pool layout of docs/architecture.md, "KV layout" ([layer][K|V][kv_head][token][head_dim]
// per block) is DenseKvCacheView.
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
  // Quantized dtypes only (ignored otherwise): where the per-row scales are.
  int64_t scale_offset = 0;        // bytes from a block's start to its scale region
  int64_t scale_layer_stride = 0;  // floats
  int64_t scale_kv_stride = 0;     // floats, K scales -> V scales of the same layer
  int64_t scale_head_stride = 0;   // floats
};

// Bytes from a Dense block's start to its scale region: the 1-byte data region
// [num_layers][2][num_kv_heads][block_size][head_dim] rounded up to a multiple of 16.
constexpr int64_t DenseKvScaleOffset(int64_t num_layers, int64_t num_kv_heads, int64_t block_size,
                                     int64_t head_dim) {
  return (num_layers * 2 * num_kv_heads * block_size * head_dim + 15) / 16 * 16;
}

// Bytes of one DenseKvCacheView block: num_layers * 2 * num_kv_heads * block_size * head_dim
// elements of DTypeSize(dtype); for a quantized dtype, the 1-byte data, padding to a multiple
// of 16 bytes, then the f32 scales [num_layers][2][num_kv_heads][block_size]. The one definition
// of a block's size (the engine's KvLayout uses it).
constexpr int64_t DenseKvBlockBytes(DType dtype, int64_t num_layers, int64_t num_kv_heads,
                                    int64_t block_size, int64_t head_dim) {
  if (IsQuantizedKvDType(dtype)) {
    return DenseKvScaleOffset(num_layers, num_kv_heads, block_size, head_dim) +
           num_layers * 2 * num_kv_heads * block_size * 4;
  }
  return num_layers * 2 * num_kv_heads * block_size * head_dim * DTypeSize(dtype);
}

// The pool's block layout (docs/architecture.md, "KV layout"): each block is
// [num_layers][2][num_kv_heads][block_size][head_dim], for a quantized dtype followed by its
// scales as in DenseKvBlockBytes.
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
  if (IsQuantizedKvDType(dtype)) {
    v.block_stride = DenseKvBlockBytes(dtype, num_layers, num_kv_heads, block_size, head_dim);
    v.scale_offset = DenseKvScaleOffset(num_layers, num_kv_heads, block_size, head_dim);
    v.scale_head_stride = block_size;
    v.scale_kv_stride = num_kv_heads * block_size;
    v.scale_layer_stride = 2 * v.scale_kv_stride;
  }
  return v;
}

// Block tables: row s lists sequence s's physical block ids (int32) in logical order: token at
// position p lives in block table[s][p / block_size], slot p % block_size.

// Writes K and V of num_tokens tokens into the pool (f32 -> cache dtype, rounded as in
// kernels/half.h, or quantized with a per-row scale as described at the top of this file). Token j
// goes to position positions[j] of sequence token_seq[j].
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

// Reads K and V of num_tokens cached tokens back to f32: the inverse of WriteKv, with the same
// addressing (token j is position positions[j] of sequence token_seq[j]). Widened exactly from
// bf16/f16; dequantized as decode(code) * scale (one f32 multiply) from i8/fp8. Used to move
// cached keys to other positions (the sink + window KV policy re-rotates its sink tokens).
struct ReadKvParams {
  float* k = nullptr;  // [num_tokens][k_token_stride]; each token's [num_kv_heads][head_dim]
  float* v = nullptr;  // [num_tokens][v_token_stride]; likewise; must not overlap k
  int64_t k_token_stride = 0;  // >= num_kv_heads * head_dim, likewise below
  int64_t v_token_stride = 0;
  KvCacheView cache;
  int64_t num_tokens = 0;
  const int32_t* positions = nullptr;     // [num_tokens], >= 0
  const int32_t* token_seq = nullptr;     // as in WriteKvParams
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
  // kCuda: allow the tensor-core kernel (kernels/cuda/prefill_tc.h) where it applies (a bf16
  // cache, head_dim a multiple of 16 up to 128): Q and the softmax weights are rounded to bf16,
  // so results match the exact kernel within about 1e-2 relative instead of f32 rounding.
  // Ignored on other devices.
  bool tensor_cores = false;
};

// One query token for each of num_seqs sequences (continuous batching): sequence s attends its
// keys [0, context_lens[s]), which include the current token (WriteKv first).
// The workspace holds the CUDA kernel's per-split partial results (split-KV attention); its size
// is DecodeAttentionWorkspaceBytes (kernels/attention.h): 0 on kCpu, where it is not used.
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
  // kCuda: the longest context_lens[s] the caller expects (0: the table's coverage). It only
  // sets how keys are cut into splits (fewer, shorter blocks for short contexts); a longer
  // context is still attended in full, by the last split. The workspace for 0 fits any value.
  int64_t max_context_len = 0;
  // Memory of ctx.device (4-byte aligned, overlapping none of q and out), at least
  // DecodeAttentionWorkspaceBytes; its contents on entry do not matter and are left undefined.
  void* workspace = nullptr;
  int64_t workspace_bytes = 0;
};

}  // namespace pd::kernels
