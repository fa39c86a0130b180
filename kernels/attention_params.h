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
//
// i4 (a quarter of f16's bytes): the row is cut into groups of kI4Group values (one group of
// head_dim when head_dim is not a multiple of it: KvScalesPerRow), each group quantized as
// above on its own with scale = amax / 7.0f, inv = 7.0f / amax,
// q[d] = clamp(nearbyint(x[d] * inv), -7, 7) (symmetric: -8 unused), stored two a byte: d even
// in the low nibble, d + 1 in the high one, as 4-bit two's complement; decode sign-extends.
// The row is head_dim / 2 bytes (head_dim must be even: KvRowPitch); its group scales follow
// each other (scale index row * groups + g). A non-finite value makes its group's scale NaN.
// Before quantizing, a group whose size is a power of two is rotated by the normalized
// Walsh-Hadamard transform (HadamardRotate: QuaRot's trick), which spreads a channel's outlier
// over the group so one scale fits all its values; the transform is its own inverse, so ReadKv
// and the reference rotate the dequantized group back, and the CPU attention rotates each
// query the same way and the output back once (q . k and sum_t p_t v_t commute with it).
#pragma once

#include <cstdint>

#include "kernels/types.h"

namespace pd::kernels {

// Largest head_dim the attention ops accept (the CPU kernels keep per-row state on the stack).
inline constexpr int64_t kMaxAttentionHeadDim = 256;

// i4's group of values sharing a scale.
inline constexpr int64_t kI4Group = 32;

// Storage units (bytes for the quantized dtypes, else elements) of one (token, kv head) row.
constexpr int64_t KvRowPitch(DType dtype, int64_t head_dim) {
  return dtype == DType::kI4 ? head_dim / 2 : head_dim;
}

// f32 scales of one row of a quantized cache: i4 one per kI4Group values (or one for the row
// when head_dim is not a multiple of kI4Group), the others one.
constexpr int64_t KvScalesPerRow(DType dtype, int64_t head_dim) {
  return dtype == DType::kI4 && head_dim % kI4Group == 0 ? head_dim / kI4Group : 1;
}

// The values one scale covers.
constexpr int64_t KvScaleGroup(DType dtype, int64_t head_dim) {
  return head_dim / KvScalesPerRow(dtype, head_dim);
}

// Whether an i4 cache stores its groups rotated (HadamardRotate): when the group is a power of
// two.
constexpr bool KvRotated(DType dtype, int64_t head_dim) {
  const int64_t g = KvScaleGroup(dtype, head_dim);
  return dtype == DType::kI4 && g > 1 && (g & (g - 1)) == 0;
}

// x[0, n) <- H_n x / sqrt(n), n a power of two: butterflies (a + b, a - b) over strides 1, 2,
// 4, ..., then one multiply each; its own inverse up to rounding. Every backend runs these
// float operations in this order (the stored bytes are the same everywhere).
inline void HadamardRotate(float* x, int64_t n) {
  for (int64_t h = 1; h < n; h *= 2) {
    for (int64_t i = 0; i < n; i += 2 * h) {
      for (int64_t j = i; j < i + h; ++j) {
        const float a = x[j];
        const float b = x[j + h];
        x[j] = a + b;
        x[j + h] = a - b;
      }
    }
  }
  // 1 / sqrt(n) rounded once (n = 2^k: 2^(-k/2)).
  float s = 1.0f;
  int64_t m = 1;
  for (; m * 4 <= n; m *= 4) s *= 0.5f;
  if (m * 2 == n) s *= 0.70710678118654752f;
  for (int64_t i = 0; i < n; ++i) x[i] *= s;
}

// One layer's view of the KV block pool. The kernels take strides instead of the engine's
// struct, so any block layout with contiguous [token][head_dim] rows works. In elements of
// `dtype` from `base` (for the quantized dtypes an element is one byte), for physical block b,
// kv head h, token slot t in the block, element d:
//   K = b * block_stride + layer * layer_stride + h * head_stride + t * head_dim + d
//   V = the K offset + kv_stride
// (i4: in bytes, with t * KvRowPitch + d / 2 for the last two terms.)
// Quantized dtypes only: with G = KvScalesPerRow, the f32 scale of row (b, h, t), group g is at
// BYTE offset
//   b * block_stride + scale_offset +
//       4 * (layer * scale_layer_stride + h * scale_head_stride + t * G + g)
// for K, plus 4 * scale_kv_stride for V (scale strides in floats). The scale
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
  // A view of some of a pool's heads (a tensor-parallel rank's): the pool's heads
  // [first_head, first_head + num_kv_heads), base moved first_head * head_stride elements past
  // the pool's and, quantized, scale_offset moved back by the same bytes and forward by
  // 4 * first_head * scale_head_stride, so the formulas above address the view's heads as
  // 0, 1, ... Kernels never read it; validation uses it to check the view against the block's
  // real start (the pool's heads before it included).
  int64_t first_head = 0;
};

// Bytes from a Dense block's start to its scale region: the data region
// [num_layers][2][num_kv_heads][block_size][row pitch] rounded up to a multiple of 16.
constexpr int64_t DenseKvScaleOffset(DType dtype, int64_t num_layers, int64_t num_kv_heads,
                                     int64_t block_size, int64_t head_dim) {
  return (num_layers * 2 * num_kv_heads * block_size * KvRowPitch(dtype, head_dim) + 15) / 16 *
         16;
}

// Bytes of one DenseKvCacheView block: num_layers * 2 * num_kv_heads * block_size * head_dim
// elements of DTypeSize(dtype); for a quantized dtype, the data (KvRowPitch bytes a row),
// padding to a multiple of 16 bytes, then the f32 scales
// [num_layers][2][num_kv_heads][block_size][KvScalesPerRow]. The one definition of a block's
// size (the engine's KvLayout uses it).
constexpr int64_t DenseKvBlockBytes(DType dtype, int64_t num_layers, int64_t num_kv_heads,
                                    int64_t block_size, int64_t head_dim) {
  if (IsQuantizedKvDType(dtype)) {
    return DenseKvScaleOffset(dtype, num_layers, num_kv_heads, block_size, head_dim) +
           num_layers * 2 * num_kv_heads * block_size * KvScalesPerRow(dtype, head_dim) * 4;
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
  v.head_stride = block_size * KvRowPitch(dtype, head_dim);
  v.kv_stride = num_kv_heads * v.head_stride;
  v.layer_stride = 2 * v.kv_stride;
  v.block_stride = num_layers * v.layer_stride;
  v.layer = layer;
  if (IsQuantizedKvDType(dtype)) {
    v.block_stride = DenseKvBlockBytes(dtype, num_layers, num_kv_heads, block_size, head_dim);
    v.scale_offset = DenseKvScaleOffset(dtype, num_layers, num_kv_heads, block_size, head_dim);
    v.scale_head_stride = block_size * KvScalesPerRow(dtype, head_dim);
    v.scale_kv_stride = num_kv_heads * v.scale_head_stride;
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

// Moves kept cached rows of one sequence into fresh blocks (the H2O and SnapKV KV policies'
// compaction): for every layer l < num_layers, K and V, kv head g < cache.num_kv_heads and
// i < num_keep, the row of source slot s = keep[(l * keep_heads + keep_first_head + g) *
// num_keep + i] (slot s % block_size of block src_blocks[s / block_size]) is copied, bytes as
// stored (a quantized row's scales too), to slot i % block_size of block
// dst_blocks[i / block_size]. cache.layer is ignored (every layer moves); a tensor-parallel
// rank's view of some heads (KvCacheView::first_head) moves those heads, whose rows of `keep`
// start at keep_first_head. No dst block may be a src block.
struct GatherKvRowsParams {
  KvCacheView cache;
  int64_t num_layers = 0;
  const int32_t* src_blocks = nullptr;  // [num_src_blocks]
  int64_t num_src_blocks = 0;
  const int32_t* dst_blocks = nullptr;  // [num_dst_blocks], num_dst_blocks * block_size >= num_keep
  int64_t num_dst_blocks = 0;
  // [num_layers][keep_heads][num_keep] source slots, each < num_src_blocks * block_size.
  const int32_t* keep = nullptr;
  int64_t num_keep = 0;
  int64_t keep_heads = 0;       // >= keep_first_head + cache.num_kv_heads
  int64_t keep_first_head = 0;  // >= 0
};

// Byte offset from the pool base of row (layer, K or V, kv head, slot) of block `block_id`:
// KvRowPitch bytes of a quantized dtype, head_dim elements of the others (KvRowBytes).
constexpr int64_t KvRowByteOffset(const KvCacheView& c, int64_t block_id, int64_t layer, bool value,
                                  int64_t kv_head, int64_t slot) {
  const int64_t unit = IsQuantizedKvDType(c.dtype) ? 1 : DTypeSize(c.dtype);
  return unit * (block_id * c.block_stride + layer * c.layer_stride + (value ? c.kv_stride : 0) +
                 kv_head * c.head_stride + slot * KvRowPitch(c.dtype, c.head_dim));
}
constexpr int64_t KvRowBytes(const KvCacheView& c) {
  return (IsQuantizedKvDType(c.dtype) ? 1 : DTypeSize(c.dtype)) * KvRowPitch(c.dtype, c.head_dim);
}
// A quantized row's scales: KvScalesPerRow floats at this byte offset from the pool base.
constexpr int64_t KvRowScalesByteOffset(const KvCacheView& c, int64_t block_id, int64_t layer,
                                        bool value, int64_t kv_head, int64_t slot) {
  return block_id * c.block_stride + c.scale_offset +
         4 * (layer * c.scale_layer_stride + (value ? c.scale_kv_stride : 0) +
              kv_head * c.scale_head_stride + slot * KvScalesPerRow(c.dtype, c.head_dim));
}

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
