// Launch-shape and index arithmetic of the CUDA kernels, as plain functions: grid and block
// sizes, shared-memory bytes, tail handling, block-table and KV-pool offsets. Compiles with g++
// (no CUDA headers), so kernels/cuda/launch_config_test.cc checks it on machines without a GPU;
// the .cu kernels call the very same functions (PD_HOST_DEVICE makes them device functions too).
// Private to kernels/cuda and kernels/dispatch. Preconditions: params validated by dispatch.
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/attention_params.h"
#include "kernels/convert_params.h"
#include "kernels/half.h"  // PD_HOST_DEVICE, F32Bits
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

// ---- Paged attention: one block of kAttentionThreads per (query row, query head); each warp
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

// rows = prefill tokens or decode sequences. Block b serves row b / num_heads, head
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
PD_HOST_DEVICE constexpr int64_t KvElementOffset(const KvCacheView& c, int64_t block_id,
                                                 int64_t kv_head, int64_t pos, bool value) {
  return block_id * c.block_stride + c.layer * c.layer_stride + (value ? c.kv_stride : 0) +
         kv_head * c.head_stride + (pos % c.block_size) * c.head_dim;
}

// Byte offset from the pool base of the f32 scale of row (K or V, kv_head, pos) of a quantized
// cache's block (kernels/attention_params.h: the scale region follows the block's data).
PD_HOST_DEVICE constexpr int64_t KvScaleByteOffset(const KvCacheView& c, int64_t block_id,
                                                   int64_t kv_head, int64_t pos, bool value) {
  return block_id * c.block_stride + c.scale_offset +
         4 * (c.layer * c.scale_layer_stride + (value ? c.scale_kv_stride : 0) +
              kv_head * c.scale_head_stride + pos % c.block_size);
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

// ---- WriteKv: one block per token, threads over the token's num_kv_heads * head_dim elements.
constexpr LaunchShape WriteKvLaunch(int64_t num_tokens, int64_t num_kv_heads, int64_t head_dim) {
  return {num_tokens, WarpRoundedThreads(num_kv_heads * head_dim, 256), 0};
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

}  // namespace pd::kernels::cuda
