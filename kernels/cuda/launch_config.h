// Launch-shape and index arithmetic of the CUDA kernels, as plain functions: grid and block
// sizes, shared-memory bytes, tail handling, block-table and KV-pool offsets. Compiles with g++
// (no CUDA headers), so kernels/cuda/launch_config_test.cc checks it on machines without a GPU;
// the .cu kernels call the very same functions (PD_HOST_DEVICE makes them device functions too).
// Private to kernels/cuda and kernels/dispatch. Preconditions: params validated by dispatch.
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/attention_mass_params.h"
#include "kernels/attention_params.h"
#include "kernels/convert_params.h"
#include "kernels/half.h"  // PD_HOST_DEVICE, F32Bits
#include "kernels/latent_attention_params.h"
#include "kernels/matmul_params.h"
#include "kernels/rope_params.h"
#include "kernels/types.h"

namespace pd::kernels::cuda {

inline constexpr int kWarpSize = 32;
inline constexpr int kMaxThreadsPerBlock = 1024;
// CUDA's limit on gridDim.x. Every kernel here uses a 1-D grid (gridDim.y/z stop at 65535,
// which a long prefill or a large batch would exceed).
inline constexpr int64_t kMaxGridX = 2147483647;

// A 1-D launch: grid blocks of `threads` threads with `shared_bytes` of dynamic shared memory.
struct LaunchShape {
  int64_t grid = 0;
  int threads = 0;
  int64_t shared_bytes = 0;
};

// ceil(a / b) for a >= 0, b > 0.
PD_HOST_DEVICE constexpr int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// One f32 operation, never contracted into an FMA (the CPU's int8 epilogue, its i4
// quantization and its Hadamard rotation are one operation per expression;
// kernels/matmul_params.h, kernels/attention_params.h).
PD_HOST_DEVICE inline float MulRn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
PD_HOST_DEVICE inline float AddRn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
PD_HOST_DEVICE inline float SubRn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}
PD_HOST_DEVICE inline float DivRn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}

// `n` rounded up to whole warps, clamped to [kWarpSize, cap] (cap a multiple of kWarpSize).
constexpr int WarpRoundedThreads(int64_t n, int cap) {
  const int64_t t = CeilDiv(n < 1 ? 1 : n, kWarpSize) * kWarpSize;
  return t > cap ? cap : static_cast<int>(t);
}

// ---- Element-wise (SiluMul, Add, Convert, Rope): one thread per item, grid-stride loop.
inline constexpr int kElementwiseThreads = 256;
// Beyond this many blocks the kernels loop (grid stride) instead of launching more.
inline constexpr int64_t kMaxElementwiseBlocks = 65536;

// n > 0 items: ceil(n / 256) blocks, at most kMaxElementwiseBlocks; the kernel covers the
// tail with `for (i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)`.
constexpr LaunchShape ElementwiseLaunch(int64_t n) {
  const int64_t blocks = CeilDiv(n, kElementwiseThreads);
  return {blocks > kMaxElementwiseBlocks ? kMaxElementwiseBlocks : blocks, kElementwiseThreads, 0};
}

// Items of a Convert: elements, or for equal dtypes (a bitwise copy) 16-bit words, so one
// kernel copies f32, bf16 and f16 alike.
PD_HOST_DEVICE constexpr int64_t ConvertItems(const ConvertParams& p) {
  return p.in_dtype == p.out_dtype ? p.n * DTypeSize(p.in_dtype) / 2 : p.n;
}

// Row and column of flat index i of a [rows][dim] iteration space.
struct RowCol {
  int64_t row = 0;
  int64_t col = 0;
};
PD_HOST_DEVICE constexpr RowCol RowColAt(int64_t i, int64_t dim) { return {i / dim, i % dim}; }

// ---- RMSNorm: one block per row.
constexpr int RmsNormThreadsPerBlock(int64_t dim) {
  return WarpRoundedThreads(dim, kMaxThreadsPerBlock);
}

// ---- RoPE: one thread per rotated pair. Item i of num_tokens * (num_heads + num_kv_heads) *
// (head_dim / 2) is (token, head, pair) with the pair fastest and q heads before k heads.
struct RopeItem {
  int64_t token = 0;
  bool is_k = false;
  int64_t head = 0;  // within q (is_k false) or k (is_k true)
  int64_t pair = 0;  // in [0, head_dim / 2)
};

PD_HOST_DEVICE constexpr int64_t RopeNumItems(const RopeParams& p) {
  return p.num_tokens * (p.num_heads + p.num_kv_heads) * (p.head_dim / 2);
}

PD_HOST_DEVICE constexpr RopeItem RopeItemAt(int64_t i, int64_t num_heads, int64_t num_kv_heads,
                                             int64_t head_dim) {
  const int64_t half = head_dim / 2;
  const int64_t heads = num_heads + num_kv_heads;
  RopeItem it;
  it.pair = i % half;
  const int64_t head_all = (i / half) % heads;
  it.token = i / half / heads;
  it.is_k = head_all >= num_heads;
  it.head = it.is_k ? head_all - num_heads : head_all;
  return it;
}

// Elements of a head rotated together as pair `pair` (see RopeStyle).
struct RopePair {
  int64_t a = 0;
  int64_t b = 0;
};
PD_HOST_DEVICE constexpr RopePair RopePairAt(RopeStyle style, int64_t head_dim, int64_t pair) {
  return style == RopeStyle::kInterleaved ? RopePair{2 * pair, 2 * pair + 1}
                                          : RopePair{pair, pair + head_dim / 2};
}

// Offset of item's head in q (is_k false) or k from the tensor's start.
PD_HOST_DEVICE constexpr int64_t RopeHeadOffset(const RopeParams& p, const RopeItem& it) {
  return it.is_k ? it.token * p.k_token_stride + it.head * p.head_dim
                 : it.token * p.q_token_stride + it.head * p.head_dim;
}

// ---- Prefill attention: one block of kAttentionThreads per (query row, query head); each warp
// takes every kAttentionWarps-th key with an online softmax, then the warps' partial results
// are merged through shared memory. A lane holds head dims lane, lane + 32, ... (at most
// kMaxDimsPerLane of them).
inline constexpr int kAttentionThreads = 128;
inline constexpr int kAttentionWarps = kAttentionThreads / kWarpSize;
inline constexpr int kMaxDimsPerLane = static_cast<int>(kMaxAttentionHeadDim / kWarpSize);
static_assert(kMaxAttentionHeadDim % kWarpSize == 0, "head dims per lane must be whole");

// Dynamic shared memory of one attention block: each warp's [head_dim] accumulator, then its
// running max and its running sum.
constexpr int64_t AttentionSharedBytes(int64_t head_dim) {
  return (kAttentionWarps * head_dim + 2 * kAttentionWarps) * static_cast<int64_t>(sizeof(float));
}

// rows = prefill tokens. Block b serves row b / num_heads, head
// b % num_heads (RowHeadAt). grid may exceed kMaxGridX only for absurd sizes; the launcher
// refuses that.
constexpr LaunchShape AttentionLaunch(int64_t rows, int64_t num_heads, int64_t head_dim) {
  return {rows * num_heads, kAttentionThreads, AttentionSharedBytes(head_dim)};
}

struct RowHead {
  int64_t row = 0;
  int64_t head = 0;
};
PD_HOST_DEVICE constexpr RowHead RowHeadAt(int64_t block, int64_t num_heads) {
  return {block / num_heads, block % num_heads};
}

// GQA: the kv head query head `head` reads.
PD_HOST_DEVICE constexpr int64_t KvHeadOf(int64_t head, int64_t num_heads, int64_t num_kv_heads) {
  return head / (num_heads / num_kv_heads);
}

// Keys visible to prefill query row i (causal): positions [0, start_pos + i].
PD_HOST_DEVICE constexpr int64_t PrefillNumKeys(int64_t start_pos, int64_t row) {
  return start_pos + row + 1;
}

// Index into a [num_seqs][max_blocks_per_seq] block-table array of the block holding
// position `pos` of sequence `seq`.
PD_HOST_DEVICE constexpr int64_t BlockTableIndex(int64_t seq, int64_t max_blocks_per_seq,
                                                 int64_t pos, int64_t block_size) {
  return seq * max_blocks_per_seq + pos / block_size;
}

// Element offset (from cache.base) of element 0 of K (value false) or V of kv head `kv_head`
// at token position `pos`, which lives in physical block `block_id` (see KvCacheView).
// (i4: the byte offset of the row, whose element d is the nibble d % 2 of byte d / 2:
// KvI4Code.)
PD_HOST_DEVICE constexpr int64_t KvElementOffset(const KvCacheView& c, int64_t block_id,
                                                 int64_t kv_head, int64_t pos, bool value) {
  return block_id * c.block_stride + c.layer * c.layer_stride + (value ? c.kv_stride : 0) +
         kv_head * c.head_stride + (pos % c.block_size) * KvRowPitch(c.dtype, c.head_dim);
}

// Byte offset from the pool base of the f32 scale of row (K or V, kv_head, pos) of a quantized
// cache's block (kernels/attention_params.h: the scale region follows the block's data); i4
// rows have KvScalesPerRow scales, `group` picks one.
PD_HOST_DEVICE constexpr int64_t KvScaleByteOffset(const KvCacheView& c, int64_t block_id,
                                                   int64_t kv_head, int64_t pos, bool value,
                                                   int64_t group = 0) {
  return block_id * c.block_stride + c.scale_offset +
         4 * (c.layer * c.scale_layer_stride + (value ? c.scale_kv_stride : 0) +
              kv_head * c.scale_head_stride +
              (pos % c.block_size) * KvScalesPerRow(c.dtype, c.head_dim) + group);
}

// ---- i4 caches (kernels/attention_params.h): codes two a byte, a scale per group, groups
// stored rotated (KvRotated). The device kernels use these; launch_config_test.cc checks them
// bitwise against the reference on the host.

// The code of element d of the i4 row at byte `row_off`, sign-extended, as a float.
PD_HOST_DEVICE inline float KvI4Code(const void* base, int64_t row_off, int64_t d) {
  const uint8_t byte = static_cast<const uint8_t*>(base)[row_off + d / 2];
  const int nibble = d % 2 == 0 ? byte & 0xF : byte >> 4;
  return static_cast<float>((nibble ^ 8) - 8);
}

// The stored scale of group g of an i4 row.
PD_HOST_DEVICE inline float KvI4Scale(const KvCacheView& c, int64_t block_id, int64_t kv_head,
                                      int64_t pos, bool value, int64_t g) {
  return *reinterpret_cast<const float*>(static_cast<const char*>(c.base) +
                                         KvScaleByteOffset(c, block_id, kv_head, pos, value, g));
}

// HadamardRotate's final factor, 1 / sqrt(n) rounded once, the same float.
PD_HOST_DEVICE inline float HadamardScale(int64_t n) {
  float s = 1.0f;
  int64_t m = 1;
  for (; m * 4 <= n; m *= 4) s *= 0.5f;
  if (m * 2 == n) s *= 0.70710678118654752f;
  return s;
}

// One butterfly of HadamardRotate at stride h seen from element `lane` of its group, holding
// `mine` while its partner lane ^ h holds `other`: the lower of the pair becomes a + b, the
// upper a - b (a the lower's value). WarpHadamard runs it across a warp's lanes.
PD_HOST_DEVICE inline float HadamardButterfly(float mine, float other, int lane, int h) {
  return (lane & h) != 0 ? SubRn(other, mine) : AddRn(mine, other);
}

// HadamardRotate (kernels/attention_params.h) with every operation rounded on its own: the
// same bits on the device as on the CPU.
PD_HOST_DEVICE inline void HadamardRotateRn(float* x, int64_t n) {
  for (int64_t h = 1; h < n; h *= 2) {
    for (int64_t i = 0; i < n; i += 2 * h) {
      for (int64_t j = i; j < i + h; ++j) {
        const float a = x[j];
        const float b = x[j + h];
        x[j] = AddRn(a, b);
        x[j + h] = SubRn(a, b);
      }
    }
  }
  const float s = HadamardScale(n);
  for (int64_t i = 0; i < n; ++i) x[i] = MulRn(x[i], s);
}

// Whether f is NaN (no library call: the same on host and device).
PD_HOST_DEVICE inline bool IsNanBits(float f) { return (F32Bits(f) & 0x7fffffffu) > 0x7f800000u; }

// i4's quantization of one row x[0, n) (kernels/attention_params.h): each group rotated
// (KvRotated) then scaled by its amax / 7, codes rounded half to even and clamped to [-7, 7],
// two a byte, low nibble first. Bytes and scales identical to the CPU's and the reference's.
PD_HOST_DEVICE inline void QuantizeI4Row(const float* x, int64_t n, uint8_t* q, float* scale) {
  const int64_t group = KvScaleGroup(DType::kI4, n);
  const bool rotated = KvRotated(DType::kI4, n);
  for (int64_t i = 0; i < n / 2; ++i) q[i] = 0;
  float xg[kMaxAttentionHeadDim];
  for (int64_t g = 0; g < n / group; ++g) {
    for (int64_t d = 0; d < group; ++d) xg[d] = x[g * group + d];
    if (rotated) HadamardRotateRn(xg, group);
    float amax = 0.0f;
    bool finite = true;
    for (int64_t d = 0; d < group; ++d) {
      const float a = fabsf(xg[d]);
      finite = finite && a <= 3.40282347e+38f;  // false for inf and NaN
      amax = a > amax ? a : amax;
    }
    if (!finite || amax == 0.0f) {
      // The quiet NaN, or 0; the group's codes stay 0.
      scale[g] = finite ? 0.0f : F32FromBits(0x7fc00000u);
      continue;
    }
    scale[g] = DivRn(amax, 7.0f);
    const float inv = DivRn(7.0f, amax);
    for (int64_t d = 0; d < group; ++d) {
      float r = rintf(MulRn(xg[d], inv));  // half to even (the default rounding mode)
      r = r > 7.0f ? 7.0f : (r < -7.0f ? -7.0f : r);
      const auto nibble = static_cast<uint8_t>(static_cast<int>(r) & 0xF);
      const int64_t e = g * group + d;
      q[e / 2] = static_cast<uint8_t>(q[e / 2] | (e % 2 == 0 ? nibble : nibble << 4));
    }
  }
}

// The i4 row (K or V, kv_head, pos) back to f32 as the CPU's ReadKv gives it: code * the
// group's scale, each group rotated back. A group with a NaN scale (it held NaN or inf) reads
// as that NaN in every element, unrotated: the CPU's multiplies and adds keep the NaN operand's
// bits, a GPU's would give the canonical NaN.
PD_HOST_DEVICE inline void ReadKvI4Row(const KvCacheView& c, int64_t block_id, int64_t kv_head,
                                       int64_t pos, bool value, float* dst) {
  const int64_t group = KvScaleGroup(DType::kI4, c.head_dim);
  const bool rotated = KvRotated(DType::kI4, c.head_dim);
  const int64_t row = KvElementOffset(c, block_id, kv_head, pos, value);
  for (int64_t g = 0; g < c.head_dim / group; ++g) {
    const float s = KvI4Scale(c, block_id, kv_head, pos, value, g);
    float* out = dst + g * group;
    if (IsNanBits(s)) {
      for (int64_t d = 0; d < group; ++d) out[d] = s;
      continue;
    }
    for (int64_t d = 0; d < group; ++d) out[d] = MulRn(KvI4Code(c.base, row, g * group + d), s);
    if (rotated) HadamardRotateRn(out, group);
  }
}

// Online softmax of one warp over its keys: state (running max m, running sum l). Folding in a
// score x gives the new state and two factors: the warp's accumulator becomes
// acc * correction + weight * V[x's key]. The first key (m = -inf) gets correction 0.
struct SoftmaxState {
  float max = -INFINITY;
  float sum = 0.0f;
};
struct SoftmaxStep {
  float correction = 0.0f;
  float weight = 0.0f;
};
PD_HOST_DEVICE inline SoftmaxStep OnlineSoftmaxUpdate(SoftmaxState* st, float score) {
  const float new_max = fmaxf(st->max, score);
  SoftmaxStep step;
  step.correction = expf(st->max - new_max);
  step.weight = expf(score - new_max);
  st->sum = st->sum * step.correction + step.weight;
  st->max = new_max;
  return step;
}

// Merging the warps' states: each warp's accumulator and sum scale by exp(max_w - global max);
// a warp that saw no key (sum 0, max -inf) gets 0 rather than exp(-inf - -inf) = NaN.
PD_HOST_DEVICE inline float WarpMergeFactor(const SoftmaxState& warp, float global_max) {
  return warp.sum > 0.0f ? expf(warp.max - global_max) : 0.0f;
}

// The softmax scale: p.scale, or 1 / sqrt(head_dim) when it is 0 (as the CPU and reference).
float AttentionScale(float scale, int64_t head_dim);

// ---- Split-KV decode attention ("flash-decoding"), DecodeAttention. Two kernels:
//
// 1. DecodeSplitKernel: one block of kDecodeThreads per (sequence, kv head, head tile, split).
//    A split is the keys [split * split_tokens, (split + 1) * split_tokens) of the sequence,
//    cut at context_lens[seq]; a block whose split starts at or past it exits at once, so the
//    grid depends on max_blocks_per_seq only (never on the lengths: CUDA graphs can replay it).
//    The block serves every query head of its kv head (GQA group), kDecodeMaxTileHeads at a
//    time (a head tile), so each K/V element is read from the pool once per tile. It walks its
//    keys in chunks of chunk_keys: the chunk's K and V rows are widened to f32 into shared
//    memory (16-byte loads where DecodeVectorLoads allows), one warp per (head, key) score,
//    one warp per head for the chunk's softmax step, one thread per (head, dim) accumulator.
//    It writes the split's partial state, unnormalised: (acc[head_dim], max, sum) per (seq,
//    query head, split), into the workspace.
// 2. DecodeMergeKernel: one block per (sequence, query head) merges its used splits in split
//    order (deterministic): out = (sum_i acc_i * e^(max_i - M)) / (sum_i l_i * e^(max_i - M)),
//    with l_i split i's sum and M the largest max_i. A sequence with one split gets acc / l.
inline constexpr int kDecodeThreads = 128;
inline constexpr int kDecodeWarps = kDecodeThreads / kWarpSize;
// Keys per split: the smallest multiple of the block size >= kDecodeSplitMinTokens (whole pool
// blocks per split, so a split never shares a block with the next one). 256 because the two
// costs it trades are both small there: (a) parallelism at small batches: 1 sequence x 8192
// tokens x 8 kv heads (the 1b preset) gives 256 blocks, about 2 per SM of an H100 (132 SMs),
// where 512 would give one per SM; (b) the per-block fixed cost: each block still reads 64 KiB
// of K/V (bf16, head_dim 64) against ~1 KiB of partial state written for 4 query heads, and
// the workspace and the count of blocks that exit at once (their cost grows with
// max_blocks_per_seq, i.e. with the model's context length) stay half of what 128 would give.
inline constexpr int64_t kDecodeSplitMinTokens = 256;
// Query heads one block serves; a larger GQA group (MQA: 32 or more) takes several tiles.
inline constexpr int64_t kDecodeMaxTileHeads = 8;
// Shared memory: the staged K chunk and V chunk hold kDecodeStageFloats f32 each (8 KiB), so
// chunk_keys = kDecodeStageFloats / head_dim keys (8 at head_dim 256, 32 at 64), at most
// kDecodeMaxChunkKeys.
inline constexpr int64_t kDecodeStageFloats = 2048;
inline constexpr int64_t kDecodeMaxChunkKeys = 64;
// Accumulator elements per thread: (tile heads x head_dim) / kDecodeThreads at most.
inline constexpr int kDecodeMaxAccPerThread =
    static_cast<int>(kDecodeMaxTileHeads * kMaxAttentionHeadDim / kDecodeThreads);
static_assert(kDecodeMaxTileHeads * kMaxAttentionHeadDim % kDecodeThreads == 0,
              "accumulators per thread must be whole");
inline constexpr int kDecodeMergeThreads = 128;
inline constexpr int kDecodeVectorBytes = 16;

// Everything about the decomposition that the launch fixes (host-computed, passed to both
// kernels by value).
struct DecodeGeometry {
  int64_t split_tokens = 0;  // keys per split
  int64_t num_splits = 0;    // splits per sequence: covers max_blocks_per_seq * block_size keys
  int64_t group = 0;         // query heads per kv head (num_heads / num_kv_heads)
  int64_t head_tiles = 0;    // tiles of at most kDecodeMaxTileHeads heads per kv head
  int64_t tile_heads = 0;    // heads of the largest tile: min(group, kDecodeMaxTileHeads)
  int64_t chunk_keys = 0;    // keys staged in shared memory at a time
};

// At most this many splits per sequence: a longer context bound gets longer splits, so a
// 131072-token block table costs 64 blocks per (sequence, kv head, head tile) rather than 512
// (most of which would exit at once at short contexts), and the workspace stays bounded.
inline constexpr int64_t kDecodeMaxSplits = 64;

// The keys the grid is cut for: DecodeAttentionParams::max_context_len when given (> 0) and
// within the table, else the table's coverage max_blocks_per_seq * block_size.
PD_HOST_DEVICE constexpr int64_t DecodeContextBound(int64_t max_blocks_per_seq, int64_t block_size,
                                                    int64_t max_context_len) {
  const int64_t coverage = max_blocks_per_seq * block_size;
  return max_context_len > 0 && max_context_len < coverage ? max_context_len : coverage;
}

// Keys per split for a context bound: whole pool blocks, at least kDecodeSplitMinTokens, and
// enough that kDecodeMaxSplits splits cover the bound.
PD_HOST_DEVICE constexpr int64_t DecodeSplitTokens(int64_t block_size, int64_t bound = 0) {
  const int64_t least = CeilDiv(kDecodeSplitMinTokens, block_size) * block_size;
  const int64_t spread = CeilDiv(CeilDiv(bound, kDecodeMaxSplits), block_size) * block_size;
  return spread > least ? spread : least;
}

PD_HOST_DEVICE constexpr int64_t DecodeNumSplits(int64_t max_blocks_per_seq, int64_t block_size,
                                                 int64_t max_context_len = 0) {
  const int64_t bound = DecodeContextBound(max_blocks_per_seq, block_size, max_context_len);
  return CeilDiv(bound, DecodeSplitTokens(block_size, bound));
}

PD_HOST_DEVICE constexpr int64_t DecodeChunkKeys(int64_t head_dim) {
  const int64_t keys = kDecodeStageFloats / head_dim;
  return keys < 1 ? 1 : (keys > kDecodeMaxChunkKeys ? kDecodeMaxChunkKeys : keys);
}

// Preconditions: the sizes are positive and num_heads a multiple of num_kv_heads.
constexpr DecodeGeometry DecodeGeometryOf(int64_t num_heads, int64_t num_kv_heads, int64_t head_dim,
                                          int64_t block_size, int64_t max_blocks_per_seq,
                                          int64_t max_context_len = 0) {
  DecodeGeometry g;
  g.split_tokens = DecodeSplitTokens(
      block_size, DecodeContextBound(max_blocks_per_seq, block_size, max_context_len));
  g.num_splits = DecodeNumSplits(max_blocks_per_seq, block_size, max_context_len);
  g.group = num_heads / num_kv_heads;
  g.head_tiles = CeilDiv(g.group, kDecodeMaxTileHeads);
  g.tile_heads = g.group < kDecodeMaxTileHeads ? g.group : kDecodeMaxTileHeads;
  g.chunk_keys = DecodeChunkKeys(head_dim);
  return g;
}

constexpr DecodeGeometry DecodeGeometryOf(const DecodeAttentionParams& p) {
  return DecodeGeometryOf(p.num_heads, p.cache.num_kv_heads, p.cache.head_dim, p.cache.block_size,
                          p.max_blocks_per_seq, p.max_context_len);
}

// The split kernel's dynamic shared memory, in floats from its start, each region starting on
// a 16-byte boundary (the vector path stores float4s into k and v):
//   q    [tile_heads][head_dim]    the tile's queries, times the softmax scale
//   k, v [chunk_keys][head_dim]    the staged chunk, widened to f32 (times the row scale)
//   p    [tile_heads][chunk_keys]  scores, then their weights e^(score - max)
//   max, sum, corr [tile_heads]    running max and sum; the chunk's rescale factor
struct DecodeSmemLayout {
  int64_t q = 0;
  int64_t k = 0;
  int64_t v = 0;
  int64_t p = 0;
  int64_t max = 0;
  int64_t sum = 0;
  int64_t corr = 0;
  int64_t total_floats = 0;
};

PD_HOST_DEVICE constexpr int64_t DecodeSmemAlign(int64_t floats) { return CeilDiv(floats, 4) * 4; }

PD_HOST_DEVICE constexpr DecodeSmemLayout DecodeSmemLayoutOf(const DecodeGeometry& g,
                                                             int64_t head_dim) {
  DecodeSmemLayout s;
  s.q = 0;
  s.k = DecodeSmemAlign(s.q + g.tile_heads * head_dim);
  s.v = DecodeSmemAlign(s.k + g.chunk_keys * head_dim);
  s.p = DecodeSmemAlign(s.v + g.chunk_keys * head_dim);
  s.max = DecodeSmemAlign(s.p + g.tile_heads * g.chunk_keys);
  s.sum = DecodeSmemAlign(s.max + g.tile_heads);
  s.corr = DecodeSmemAlign(s.sum + g.tile_heads);
  s.total_floats = s.corr + g.tile_heads;
  return s;
}

// grid = num_seqs * num_kv_heads * head_tiles * num_splits (the split fastest), so that most of
// the blocks that exit at once (splits past a short sequence's end) are neighbours.
constexpr LaunchShape DecodeSplitLaunch(const DecodeGeometry& g, int64_t num_seqs,
                                        int64_t num_kv_heads, int64_t head_dim) {
  return {num_seqs * num_kv_heads * g.head_tiles * g.num_splits, kDecodeThreads,
          DecodeSmemLayoutOf(g, head_dim).total_floats * static_cast<int64_t>(sizeof(float))};
}

// grid = num_seqs * num_heads: block b merges sequence b / num_heads, head b % num_heads
// (RowHeadAt).
constexpr LaunchShape DecodeMergeLaunch(int64_t num_seqs, int64_t num_heads) {
  return {num_seqs * num_heads, kDecodeMergeThreads, 0};
}

struct DecodeSplitBlock {
  int64_t seq = 0;
  int64_t kv_head = 0;
  int64_t head_tile = 0;
  int64_t split = 0;
};

PD_HOST_DEVICE constexpr DecodeSplitBlock DecodeSplitBlockAt(int64_t block, const DecodeGeometry& g,
                                                             int64_t num_kv_heads) {
  DecodeSplitBlock b;
  b.split = block % g.num_splits;
  int64_t rest = block / g.num_splits;
  b.head_tile = rest % g.head_tiles;
  rest /= g.head_tiles;
  b.kv_head = rest % num_kv_heads;
  b.seq = rest / num_kv_heads;
  return b;
}

// Keys [begin, end) of split `split` of a sequence of context_len keys; begin >= end (nothing
// to do) when the split starts at or past the end.
struct KeyRange {
  int64_t begin = 0;
  int64_t end = 0;
};
// With num_splits > 0 the last split also takes every key past its share, so a context longer
// than the bound the grid was cut for (max_context_len) is still attended in full.
PD_HOST_DEVICE constexpr KeyRange DecodeSplitKeys(int64_t split, int64_t split_tokens,
                                                  int64_t context_len, int64_t num_splits = 0) {
  const int64_t begin = split * split_tokens;
  int64_t end = begin + split_tokens < context_len ? begin + split_tokens : context_len;
  if (num_splits > 0 && split == num_splits - 1) {
    end = context_len;
  }
  return {begin, end > begin ? end : begin};
}

// Splits holding at least one of context_len >= 1 keys: 0 .. DecodeUsedSplits - 1 (at most
// num_splits when it is > 0).
PD_HOST_DEVICE constexpr int64_t DecodeUsedSplits(int64_t context_len, int64_t split_tokens,
                                                  int64_t num_splits = 0) {
  const int64_t used = CeilDiv(context_len, split_tokens);
  return num_splits > 0 && used > num_splits ? num_splits : used;
}

// Query heads [first, first + count) of head tile `head_tile` of kv head `kv_head` (GQA: query
// head h reads kv head h / group, as KvHeadOf).
struct HeadRange {
  int64_t first = 0;
  int64_t count = 0;
};
PD_HOST_DEVICE constexpr HeadRange DecodeTileHeads(int64_t kv_head, int64_t head_tile,
                                                   int64_t group) {
  const int64_t offset = head_tile * kDecodeMaxTileHeads;
  const int64_t left = group - offset;
  return {kv_head * group + offset, left < kDecodeMaxTileHeads ? left : kDecodeMaxTileHeads};
}

// The workspace (f32): one record of head_dim + 2 floats per (sequence, query head, split),
// the split fastest: acc[0, head_dim), then max, then sum. Records of splits past a
// sequence's end are neither written nor read.
PD_HOST_DEVICE constexpr int64_t DecodePartialIndex(int64_t seq, int64_t head, int64_t split,
                                                    int64_t num_heads, int64_t num_splits) {
  return (seq * num_heads + head) * num_splits + split;
}
PD_HOST_DEVICE constexpr int64_t DecodeRecordFloats(int64_t head_dim) { return head_dim + 2; }
PD_HOST_DEVICE constexpr int64_t DecodeAccOffset(int64_t partial, int64_t head_dim, int64_t d) {
  return partial * DecodeRecordFloats(head_dim) + d;
}
PD_HOST_DEVICE constexpr int64_t DecodeMaxOffset(int64_t partial, int64_t head_dim) {
  return partial * DecodeRecordFloats(head_dim) + head_dim;
}
PD_HOST_DEVICE constexpr int64_t DecodeSumOffset(int64_t partial, int64_t head_dim) {
  return partial * DecodeRecordFloats(head_dim) + head_dim + 1;
}

// Workspace bytes of a call: every record of the grid. Depends on the sizes only (not the
// lengths), so an engine sizes it once for its largest batch. Preconditions: sizes positive.
constexpr int64_t DecodeWorkspaceBytes(int64_t num_seqs, int64_t num_heads, int64_t head_dim,
                                       int64_t max_blocks_per_seq, int64_t block_size,
                                       int64_t max_context_len = 0) {
  return num_seqs * num_heads * DecodeNumSplits(max_blocks_per_seq, block_size, max_context_len) *
         DecodeRecordFloats(head_dim) * static_cast<int64_t>(sizeof(float));
}

// Whether the split kernel stages K/V with 16-byte loads: an f32, bf16 or f16 cache whose rows
// all start 16-byte aligned (base, and block, layer, K->V, head and token strides in bytes all
// multiples of 16; the token stride is head_dim, so head_dim a multiple of 4 for f32, 8 for
// bf16/f16). Otherwise (and always for i8/fp8, whose values need their row scale) it loads
// element by element.
bool DecodeVectorLoads(const KvCacheView& c);

// Block-local indices (a chunk's rows and units, a tile's heads and accumulators) are int:
// they stay below kDecodeMaxChunkKeys * kMaxAttentionHeadDim, and 32-bit division is several
// times cheaper than 64-bit on the GPU.
//
// Staging a chunk: its rows are cut into units (16-byte vectors, or single elements on the
// scalar path); thread t stages units t, t + kDecodeThreads, ... of the chunk's
// rows * units_per_row.
struct DecodeStageShape {
  int units_per_row = 0;
  int elems_per_unit = 0;
};
PD_HOST_DEVICE constexpr DecodeStageShape DecodeStageShapeOf(DType dtype, int head_dim,
                                                             bool vector) {
  if (!vector) {
    return {head_dim, 1};
  }
  const int elems = kDecodeVectorBytes / DTypeSize(dtype);
  return {head_dim / elems, elems};
}

// Unit i of a chunk: row (key first_key + row) and its first element within the row.
struct DecodeStageUnit {
  int row = 0;
  int elem = 0;
};
PD_HOST_DEVICE constexpr DecodeStageUnit DecodeStageUnitAt(int i, const DecodeStageShape& s) {
  return {i / s.units_per_row, (i % s.units_per_row) * s.elems_per_unit};
}

// Item i of a [rows][cols] block-local iteration space (scores: (head, key) items; the
// accumulators: (head, dim) elements, thread t owning t + j * kDecodeThreads for j <
// kDecodeMaxAccPerThread).
struct LocalRowCol {
  int row = 0;
  int col = 0;
};
PD_HOST_DEVICE constexpr LocalRowCol LocalRowColAt(int i, int cols) { return {i / cols, i % cols}; }

// One little-endian 32-bit word of a 16-byte vector of an f32, bf16 or f16 row (a uint4 holds
// four) widened to f32: KvWordElems floats, the low half of the word first.
PD_HOST_DEVICE constexpr int64_t KvWordElems(DType dtype) { return 4 / DTypeSize(dtype); }
PD_HOST_DEVICE inline void UnpackKvWord(uint32_t word, DType dtype, float* out) {
  if (dtype == DType::kF32) {
    out[0] = F32FromBits(word);
  } else if (dtype == DType::kBF16) {
    out[0] = Bf16ToF32(static_cast<uint16_t>(word & 0xffffu));
    out[1] = Bf16ToF32(static_cast<uint16_t>(word >> 16));
  } else {
#if defined(__CUDA_ARCH__)
    // The hardware conversion: exact like F16ToF32 (NaN payloads aside), and without
    // F16ToF32's branches, which inlined 16 times per chunk row make the kernel spill.
    const uint16_t lo = static_cast<uint16_t>(word & 0xffffu);
    const uint16_t hi = static_cast<uint16_t>(word >> 16);
    asm("cvt.f32.f16 %0, %1;" : "=f"(out[0]) : "h"(lo));
    asm("cvt.f32.f16 %0, %1;" : "=f"(out[1]) : "h"(hi));
#else
    out[0] = F16ToF32(static_cast<uint16_t>(word & 0xffffu));
    out[1] = F16ToF32(static_cast<uint16_t>(word >> 16));
#endif
  }
}

// One chunk's softmax step for one head: the new running max and the factor the running sum
// and accumulators are multiplied by. The first chunk (old_max -inf) gets factor 0.
struct SoftmaxRescale {
  float max = 0.0f;
  float correction = 0.0f;
};
PD_HOST_DEVICE inline SoftmaxRescale SoftmaxRescaleOf(float old_max, float chunk_max) {
  const float new_max = fmaxf(old_max, chunk_max);
  return {new_max, expf(old_max - new_max)};
}

// The merge of one (sequence, query head): its records are partials first .. first + used - 1
// (DecodePartialIndex of split 0 and DecodeUsedSplits). Every used split saw at least one key,
// so each sum is > 0 (or NaN, which then poisons the output as on the CPU).
struct DecodeMergeTotals {
  float max = 0.0f;  // the largest split max
  float sum = 0.0f;  // sum_i sum_i * e^(max_i - max), in split order
};
PD_HOST_DEVICE inline DecodeMergeTotals DecodeMergeTotalsOf(const float* ws, int64_t first,
                                                            int64_t used, int64_t head_dim) {
  DecodeMergeTotals t;
  t.max = -INFINITY;
  for (int64_t i = 0; i < used; ++i) {
    t.max = fmaxf(t.max, ws[DecodeMaxOffset(first + i, head_dim)]);
  }
  for (int64_t i = 0; i < used; ++i) {
    t.sum += ws[DecodeSumOffset(first + i, head_dim)] *
             expf(ws[DecodeMaxOffset(first + i, head_dim)] - t.max);
  }
  return t;
}

// Output element d of the merge, the splits summed in order.
PD_HOST_DEVICE inline float DecodeMergeElement(const float* ws, int64_t first, int64_t used,
                                               int64_t head_dim, const DecodeMergeTotals& t,
                                               int64_t d) {
  float o = 0.0f;
  for (int64_t i = 0; i < used; ++i) {
    o += ws[DecodeAccOffset(first + i, head_dim, d)] *
         expf(ws[DecodeMaxOffset(first + i, head_dim)] - t.max);
  }
  return o / t.sum;
}

// ---- WriteKv: one block per token, threads over the token's num_kv_heads * head_dim elements.
constexpr LaunchShape WriteKvLaunch(int64_t num_tokens, int64_t num_kv_heads, int64_t head_dim) {
  return {num_tokens, WarpRoundedThreads(num_kv_heads * head_dim, 256), 0};
}

// ---- ReadKv: WriteKv's grid and addressing (one block per token, threads over the token's
// num_kv_heads * head_dim elements); thread t reads elements t, t + threads, ... of K and of V.
constexpr LaunchShape ReadKvLaunch(int64_t num_tokens, int64_t num_kv_heads, int64_t head_dim) {
  return WriteKvLaunch(num_tokens, num_kv_heads, head_dim);
}

// Element e = kv_head * head_dim + d of an i4 row as ReadKvI4Row gives it: its group
// dequantized and, rotated, rotated back (a rotated group has at most kWarpSize elements:
// KvScaleGroup is kI4Group = 32 or, when that does not divide head_dim, head_dim itself, a
// power of two only below 32). Costs a group's rotation per element: for the paths that read
// single elements (ReadKv, LatentAttention); attention reads whole rows.
PD_HOST_DEVICE inline float ReadKvI4Element(const KvCacheView& c, int64_t block_id, int64_t pos,
                                            int64_t e, bool value) {
  const int64_t kv_head = e / c.head_dim, d = e % c.head_dim;
  const int64_t group = KvScaleGroup(DType::kI4, c.head_dim), g = d / group;
  const int64_t row = KvElementOffset(c, block_id, kv_head, pos, value);
  const float s = KvI4Scale(c, block_id, kv_head, pos, value, g);
  if (IsNanBits(s)) {
    return s;
  }
  if (!KvRotated(DType::kI4, c.head_dim)) {
    return MulRn(KvI4Code(c.base, row, d), s);
  }
  float x[kWarpSize];
  for (int64_t i = 0; i < group; ++i) x[i] = MulRn(KvI4Code(c.base, row, g * group + i), s);
  HadamardRotateRn(x, group);
  return x[d % group];
}

// Element e = kv_head * head_dim + d of the K (value false) or V row of the token at `pos`,
// stored in physical block `block_id`, back to f32 exactly as the CPU ReadKv: f32 as stored,
// bf16/f16 widened (exact), i8/fp8 as decode(code) * the row's scale, one f32 multiply, i4 as
// ReadKvI4Element. A NaN
// scale (a row that held NaN or inf) is returned as stored: a GPU multiply by NaN yields the
// canonical NaN 0x7fffffff, the CPU's keeps the operand's bits, and ReadKv is bitwise.
PD_HOST_DEVICE inline float ReadKvElement(const KvCacheView& c, int64_t block_id, int64_t pos,
                                          int64_t e, bool value) {
  const int64_t kv_head = e / c.head_dim;
  const int64_t off = KvElementOffset(c, block_id, kv_head, pos, value) + e % c.head_dim;
  switch (c.dtype) {
    case DType::kF32:
      return static_cast<const float*>(c.base)[off];
    case DType::kBF16:
      return Bf16ToF32(static_cast<const uint16_t*>(c.base)[off]);
    case DType::kF16:
      return F16ToF32(static_cast<const uint16_t*>(c.base)[off]);
    case DType::kI4:
      return ReadKvI4Element(c, block_id, pos, e, value);
    case DType::kI8:
    case DType::kF8E4M3:
      break;
  }
  const uint8_t byte = static_cast<const uint8_t*>(c.base)[off];
  const float code =
      c.dtype == DType::kI8 ? static_cast<float>(static_cast<int8_t>(byte)) : E4M3ToF32(byte);
  const float scale = *reinterpret_cast<const float*>(
      static_cast<const char*>(c.base) + KvScaleByteOffset(c, block_id, kv_head, pos, value));
  return (F32Bits(scale) & 0x7fffffffu) > 0x7f800000u ? scale : code * scale;
}

// ---- LatentAttention (MLA, absorbed; kernels/latent_attention_params.h): the prefill
// attention's shape, one block of kAttentionThreads per (query token, query head), warps taking
// every kAttentionWarps-th key with an online softmax, then merged through shared memory as
// AttendRow does. A lane holds entry elements lane, lane + 32, ... (at most
// kMaxLatentDimsPerLane); the merge keeps each warp's [value_dim] sums.
inline constexpr int kMaxLatentDimsPerLane = static_cast<int>(kMaxLatentEntryDim / kWarpSize);
static_assert(kMaxLatentEntryDim % kWarpSize == 0, "entry elements per lane must be whole");

constexpr LaunchShape LatentAttentionLaunch(int64_t num_tokens, int64_t num_heads,
                                            int64_t value_dim) {
  return AttentionLaunch(num_tokens, num_heads, value_dim);
}

// The elements of one cached entry: the K pieces of every kv head, then the V pieces.
PD_HOST_DEVICE constexpr int64_t LatentEntryDim(const KvCacheView& c) {
  return 2 * c.num_kv_heads * c.head_dim;
}

// Element e of the entry of the token at `pos` (in physical block `block_id`), back to f32
// as ReadKv reads it: element e of the K rows below num_kv_heads * head_dim, of the V rows above.
PD_HOST_DEVICE inline float LatentEntryElement(const KvCacheView& c, int64_t block_id, int64_t pos,
                                               int64_t e) {
  const int64_t half = c.num_kv_heads * c.head_dim;
  return e < half ? ReadKvElement(c, block_id, pos, e, /*value=*/false)
                  : ReadKvElement(c, block_id, pos, e - half, /*value=*/true);
}

// ---- Sampling: one block per sequence (the algorithm: kernels/cuda/sampling_radix.h).
inline constexpr int kSamplingThreads = 1024;
inline constexpr int kSamplingWarps = kSamplingThreads / kWarpSize;
constexpr LaunchShape SamplingLaunch(int64_t num_seqs) { return {num_seqs, kSamplingThreads, 0}; }

// The rank key of a non-NaN logit: keys ascend exactly in the rank order of
// kernels/sampling_params.h (logit descending, then id ascending), so "the first k candidates"
// is "keys <= the k-th smallest key". -0.0 ranks as +0.0 (they compare equal).
PD_HOST_DEVICE inline uint64_t SamplingRankKey(float logit, int32_t id) {
  uint32_t bits = logit == 0.0f ? 0u : F32Bits(logit);
  // Map to unsigned so larger floats give larger integers, then invert for descending.
  const uint32_t ascending = (bits & 0x80000000u) != 0 ? ~bits : bits | 0x80000000u;
  return (static_cast<uint64_t>(~ascending) << 32) | static_cast<uint32_t>(id);
}

// A contiguous range [begin, end) of ids.
struct Segment {
  int64_t begin = 0;
  int64_t end = 0;
};

// Warp w's contiguous share of n ids split over `warps` warps, in ascending order, each share a
// whole number of 32-id steps (lane l reads id begin + 32 j + l: coalesced). The draw walks
// ids in ascending order: warp by warp, step by step.
PD_HOST_DEVICE constexpr Segment DrawChunkOf(int64_t warp, int64_t n, int64_t warps) {
  const int64_t per = CeilDiv(CeilDiv(n, warps), kWarpSize) * kWarpSize;
  const int64_t begin = warp * per < n ? warp * per : n;
  return {begin, begin + per < n ? begin + per : n};
}

// ---- CopyBlocks: each block of bytes is cut into segments of kCopySegmentBytes (the last one
// shorter); one thread block copies one segment with the widest access that every address and
// size allows.
inline constexpr int kCopyThreads = 256;
inline constexpr int64_t kCopySegmentBytes = int64_t{64} << 10;

// Largest of 16, 8, 4, 2, 1 dividing both base addresses, both strides and block_bytes.
int CopyAccessBytes(const void* src, const void* dst, int64_t src_stride, int64_t dst_stride,
                    int64_t block_bytes);

constexpr int64_t CopySegmentsPerBlock(int64_t block_bytes) {
  return CeilDiv(block_bytes, kCopySegmentBytes);
}

constexpr LaunchShape CopyBlocksLaunch(int64_t num_copies, int64_t block_bytes) {
  return {num_copies * CopySegmentsPerBlock(block_bytes), kCopyThreads, 0};
}

struct CopySegment {
  int64_t copy = 0;   // which of the num_copies
  int64_t begin = 0;  // byte range within the block
  int64_t end = 0;
};
PD_HOST_DEVICE constexpr CopySegment CopySegmentAt(int64_t block, int64_t segments_per_block,
                                                   int64_t block_bytes) {
  const int64_t begin = (block % segments_per_block) * kCopySegmentBytes;
  const int64_t end =
      begin + kCopySegmentBytes < block_bytes ? begin + kCopySegmentBytes : block_bytes;
  return {block / segments_per_block, begin, end};
}

// ---- MatMul through cuBLAS (column-major). Row-major y[m][n] = x[m][k] w[n][k]^T is, in
// column-major terms, y^T = op_T(w) * x^T: gemm(T, N, tile_rows, num_rows, k, w tile (lda k),
// x (ldb), y + first output (ldc y_row_stride)).
//   f32 weights   one cublasSgemm; x as given (ldb x_row_stride). All arithmetic f32, as on CPU.
//   bf16 weights  native (issue #16 item 1): x is rounded to bf16 once, packed into the
//                 workspace (ldb k), and one cublasGemmEx multiplies the weights as stored,
//                 bf16 x bf16 on the tensor cores with f32 accumulation and f32 output. The
//                 only difference from the CPU kernel is x's rounding to bf16 (and the order of
//                 the f32 sums): logits agree within a tolerance, not bitwise.
//   f16 weights   widened to f32 tile by tile into the workspace, then cublasSgemm (f16
//                 activations could overflow, so x is not rounded to f16).
inline constexpr int64_t kMatMulWideningTileBytes = int64_t{32} << 20;

// Whether MatMul runs as one bf16 cublasGemmEx (bf16 weights).
bool MatMulNativeBf16(const MatMulParams& p);

// int8 weights (W8A8, issue #18 item 4): x quantized row by row into the workspace (the
// QuantizeRowsInt8 rule: codes, then the f32 row scales), one cublasGemmEx int8 x int8 -> int32
// (exact integer sums, like the CPU's), then an epilogue applying the row and weight scales,
// bias and accumulate with the reference's float operations one at a time: bitwise the CPU
// result. cuBLAS's int8 GEMM needs in_features (k, the leading dimensions) a multiple of 4.
inline constexpr int kQuantizeRowThreads = 256;
struct MatMulI8Workspace {
  int64_t xq = 0;   // int8 [num_rows][in_features]
  int64_t sx = 0;   // f32 [num_rows]
  int64_t acc = 0;  // int32 [num_rows][out_features]
  int64_t total = 0;
};
// Byte offsets into the workspace, each 256-byte aligned.
MatMulI8Workspace MatMulI8Layout(const MatMulParams& p);
bool MatMulI8Shape(const MatMulParams& p);  // in_features % 4 == 0

// The int8 epilogue of output (r, o): v = float(acc) * (sx[r] * w_scales[o]), + bias[o], then
// y = accumulate ? y + v : v (kernels/matmul_params.h).
PD_HOST_DEVICE inline float MatMulI8Output(int32_t acc, float sx, float w_scale, const float* bias,
                                           int64_t o, float y_old, bool accumulate) {
  float v = MulRn(static_cast<float>(acc), MulRn(sx, w_scale));
  if (bias != nullptr) {
    v = AddRn(v, bias[o]);
  }
  return accumulate ? AddRn(y_old, v) : v;
}

// Output rows (weight rows) per cuBLAS call: all of them for f32 and bf16 weights; for f16 as
// many f32 weight rows as fit tile_bytes, at least one. (tile_bytes is a parameter for the
// tests.)
int64_t MatMulTileRows(const MatMulParams& p, int64_t tile_bytes = kMatMulWideningTileBytes);

// Device workspace bytes a CUDA MatMul needs: 0 for f32 weights, x rounded to bf16
// (num_rows x in_features x 2) for bf16, one widened tile for f16.
int64_t MatMulWorkspaceBytes(const MatMulParams& p);

struct GemmCall {
  int m = 0;  // output features in this tile
  int n = 0;  // num_rows
  int k = 0;  // in_features
  int lda = 0;
  int ldb = 0;
  int ldc = 0;
  int64_t y_offset = 0;  // elements from p.y to this tile's first output
  int64_t w_offset = 0;  // weight elements from p.w to this tile's first row
};

// The cuBLAS call for the tile starting at output feature `first_out` (a multiple of
// MatMulTileRows(p, tile_bytes)).
GemmCall MatMulTile(const MatMulParams& p, int64_t first_out,
                    int64_t tile_bytes = kMatMulWideningTileBytes);

// ---- AttentionMass (kernels/attention_mass_params.h) on CUDA, for the H2O and SnapKV KV
// policies: two kernels, so every cached key's mass is owned by one thread and added in the
// params' order (query j ascending, then the group's heads), deterministic run to run.
//   MassStatsKernel: one block of kMassThreads per (query j, query head h); its threads take
//     keys t = thread, thread + kMassThreads, ... and the block reduces the row's max and sum of
//     exp(score - max) into workspace[(j * num_heads + h) * 2 + {0, 1}].
//   MassAddKernel: grid (num_kv_heads, MassKeyTiles(keys)); thread i of block (g, b) owns slot
//     t = b * kMassThreads + i and adds exp(score - max) / sum for every (j, h) that attends it.
// Every score is computed twice (once per kernel) by MassScore: the CPU's dot product and scale
// bit for bit; the sum differs from the CPU's by the reduction order (and expf by an ulp), so
// CUDA's mass is within float tolerance of the CPU's, not bitwise.
inline constexpr int kMassThreads = 256;

PD_HOST_DEVICE constexpr int64_t MassKeyTiles(int64_t keys) {
  return (keys + kMassThreads - 1) / kMassThreads;
}

// Element d of key t of kv head g: the caller's f32 rows, or read from the cache through the
// sequence's block table as ReadKv reads it (latent: element d of the whole entry,
// LatentEntryElement).
PD_HOST_DEVICE inline float MassKeyElement(const AttentionMassParams& p, const KvCacheView& c,
                                           int64_t t, int64_t g, int64_t d) {
  if (p.k != nullptr) {
    return p.k[t * p.k_token_stride + g * p.head_dim + d];
  }
  const int64_t block_id = p.block_table[t / c.block_size];
  if (p.latent) {
    return LatentEntryElement(c, block_id, t, d);
  }
  return ReadKvElement(c, block_id, t, g * c.head_dim + d, /*value=*/false);
}

// scale * (q_{j,h} . k_{t,g}) with the CPU's float operations in its order (eight running sums,
// lane l taking d = l mod 8, added pairwise), each rounded on its own.
PD_HOST_DEVICE inline float MassScore(const AttentionMassParams& p, const KvCacheView& c, int64_t j,
                                      int64_t h, int64_t t, int64_t g, float scale) {
  const float* q = p.q + j * p.q_token_stride + h * p.head_dim;
  // An i4 cache's key is read whole (its groups rotated back once, not once per element).
  const bool i4 = p.k == nullptr && !p.latent && c.dtype == DType::kI4;
  float i4_key[kMaxAttentionHeadDim];
  if (i4) {
    ReadKvI4Row(c, p.block_table[t / c.block_size], g, t, /*value=*/false, i4_key);
  }
  auto key = [&](int64_t d) { return i4 ? i4_key[d] : MassKeyElement(p, c, t, g, d); };
  float lane[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
  int64_t d = 0;
  for (; d + 8 <= p.head_dim; d += 8) {
    for (int l = 0; l < 8; ++l) {
      lane[l] = AddRn(lane[l], MulRn(q[d + l], key(d + l)));
    }
  }
  for (int l = 0; d < p.head_dim; ++d, ++l) {
    lane[l] = AddRn(lane[l], MulRn(q[d], key(d)));
  }
  const float dot = AddRn(AddRn(AddRn(lane[0], lane[1]), AddRn(lane[2], lane[3])),
                          AddRn(AddRn(lane[4], lane[5]), AddRn(lane[6], lane[7])));
  return MulRn(scale, dot);
}

// The scale the CPU uses: p.scale, or 1 / sqrt(head_dim) when it is 0.
PD_HOST_DEVICE inline float MassScale(const AttentionMassParams& p) {
  return p.scale != 0.0f ? p.scale : 1.0f / sqrtf(static_cast<float>(p.head_dim));
}

// MassAddKernel's work for slot t of kv head g, given the rows' (max, sum) in `stats`: the mass
// it receives from the call's queries, added to `mass` in the params' order.
PD_HOST_DEVICE inline float MassOfSlot(const AttentionMassParams& p, const KvCacheView& c,
                                       const float* stats, int64_t g, int64_t t, float mass) {
  const int64_t group = p.num_heads / p.num_kv_heads;
  const float scale = MassScale(p);
  // Query j attends keys [0, start_pos + j]: the first that reaches t is j = t - start_pos.
  const int64_t first = t > p.start_pos ? t - p.start_pos : 0;
  for (int64_t j = first; j < p.num_tokens; ++j) {
    for (int64_t h = g * group; h < (g + 1) * group; ++h) {
      const float max = stats[(j * p.num_heads + h) * 2];
      const float sum = stats[(j * p.num_heads + h) * 2 + 1];
      const float e = expf(AddRn(MassScore(p, c, j, h, t, g, scale), -max));
      mass = AddRn(mass, e / sum);
    }
  }
  return mass;
}

}  // namespace pd::kernels::cuda
