// Paged attention on CUDA: WriteKv, ReadKv (its inverse, for the sink + window KV policy),
// PrefillAttention (causal, one sequence) and DecodeAttention (one query per sequence).
//
// PrefillAttention: simple and exact rather than fast: one thread block per (query row, query
// head), keys split over its warps with an online softmax in f32, the cache dtype (f32/bf16/f16,
// i8/fp8 codes times their row's scale, i4 codes times their group's scale) decided per load
// at run time.
//
// i4 caches hold each group rotated (kernels/attention_params.h), so, as on the CPU, the query
// is rotated instead of every key (q . k = Hq . Hk) and the output rotated back once (V's rows
// are summed rotated: sum p_t v_t = H sum p_t H v_t). PrefillAttention rotates in registers
// across a warp's lanes (WarpHadamard: a group of at most 32 elements is one lane each);
// DecodeAttention rotates the query tile in shared memory and the merged output in the merge
// kernel (HadamardRotateRn, the CPU's operations in its order).
//
// DecodeAttention is split-KV ("flash-decoding", issue #16 item 4): DecodeSplitKernel runs one
// block per (sequence, kv head, head tile, split of >= 256 keys) and serves all query heads of
// the kv head's GQA group (up to 8 per tile) from one read of each K/V element, staged chunk by
// chunk into shared memory as f32 (16-byte loads for f32/bf16/f16 caches with aligned rows,
// element loads otherwise and for i8/fp8/i4); it writes each head's unnormalised partial (acc,
// max, sum) to the workspace. DecodeMergeKernel then merges each (sequence, head)'s splits in split
// order, so results are deterministic and do not depend on the batch. The grid depends only on
// max_blocks_per_seq: blocks past a sequence's length exit at once. All index arithmetic is in
// launch_config.h, checked on the host by launch_config_decode_test.cc (including an emulation
// of both kernels against kernels/reference). Not yet run or measured on a GPU.
//
// Quantized rows are written by one thread each, with the reference's float operations, so the
// bytes equal the CPU's (i4 included: QuantizeI4Row, its rotation HadamardRotateRn).
#include <cmath>

#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/device_utils.cuh"
#include "kernels/cuda/launch_config.h"
#include "kernels/cuda/prefill_tc.h"

namespace pd::kernels::cuda {
namespace {

// The physical block holding token j of a WriteKv or ReadKv (position pos of sequence
// token_seq[j], row 0 without token_seq).
template <typename P>
__device__ int64_t TokenBlock(const P& p, int64_t j, int64_t pos) {
  const int64_t seq = p.token_seq != nullptr ? p.token_seq[j] : 0;
  return p.block_tables[BlockTableIndex(seq, p.max_blocks_per_seq, pos, p.cache.block_size)];
}

// grid = num_tokens (WriteKvLaunch): block j writes token j's K and V rows, all kv heads.
__global__ void WriteKvKernel(WriteKvParams p) {
  const KvCacheView& c = p.cache;
  const int64_t j = blockIdx.x;
  const int64_t pos = p.positions[j];
  const int64_t block_id = TokenBlock(p, j, pos);
  if (IsQuantizedKvDType(c.dtype)) {
    // One thread per (K or V, kv head) row: its scale needs the whole row.
    for (int64_t r = threadIdx.x; r < 2 * c.num_kv_heads; r += blockDim.x) {
      const bool value = r >= c.num_kv_heads;
      const int64_t h = r % c.num_kv_heads;
      const float* x =
          (value ? p.v + j * p.v_token_stride : p.k + j * p.k_token_stride) + h * c.head_dim;
      uint8_t* q = static_cast<uint8_t*>(c.base) + KvElementOffset(c, block_id, h, pos, value);
      float* scale = reinterpret_cast<float*>(static_cast<char*>(c.base) +
                                              KvScaleByteOffset(c, block_id, h, pos, value));
      QuantizeKvRow(x, c.head_dim, c.dtype, q, scale);
    }
    return;
  }
  const int64_t elems = c.num_kv_heads * c.head_dim;
  for (int64_t e = threadIdx.x; e < elems; e += blockDim.x) {
    const int64_t h = e / c.head_dim, d = e % c.head_dim;
    const int64_t k_off = KvElementOffset(c, block_id, h, pos, /*value=*/false) + d;
    StoreKv(c.base, c.dtype, k_off, p.k[j * p.k_token_stride + e]);
    StoreKv(c.base, c.dtype, k_off + c.kv_stride, p.v[j * p.v_token_stride + e]);
  }
}

// grid = num_tokens (ReadKvLaunch): block j reads token j's K and V rows, all kv heads, back to
// f32 (ReadKvElement: the CPU's values bit for bit).
__global__ void ReadKvKernel(ReadKvParams p) {
  const KvCacheView& c = p.cache;
  const int64_t j = blockIdx.x;
  const int64_t pos = p.positions[j];
  const int64_t block_id = TokenBlock(p, j, pos);
  if (c.dtype == DType::kI4) {
    // One thread per (K or V, kv head) row: each group is rotated back whole.
    for (int64_t r = threadIdx.x; r < 2 * c.num_kv_heads; r += blockDim.x) {
      const bool value = r >= c.num_kv_heads;
      const int64_t h = r % c.num_kv_heads;
      float* dst =
          (value ? p.v + j * p.v_token_stride : p.k + j * p.k_token_stride) + h * c.head_dim;
      ReadKvI4Row(c, block_id, h, pos, value, dst);
    }
    return;
  }
  const int64_t elems = c.num_kv_heads * c.head_dim;
  for (int64_t e = threadIdx.x; e < elems; e += blockDim.x) {
    p.k[j * p.k_token_stride + e] = ReadKvElement(c, block_id, pos, e, /*value=*/false);
    p.v[j * p.v_token_stride + e] = ReadKvElement(c, block_id, pos, e, /*value=*/true);
  }
}

// HadamardRotate of groups of `group` (a power of two up to kWarpSize) consecutive lanes, lane
// l holding element l % group of its group: HadamardButterfly at strides 1, 2, 4, ..., then
// the scale; the CPU's operations in its order, so the bits equal HadamardRotate's. Called by
// all 32 lanes of a warp.
__device__ float WarpHadamard(float x, int group) {
  const int lane = static_cast<int>(threadIdx.x % kWarpSize);
  for (int h = 1; h < group; h *= 2) {
    x = HadamardButterfly(x, __shfl_xor_sync(0xffffffffu, x, h), lane, h);
  }
  return MulRn(x, HadamardScale(group));
}

// Merges the kAttentionWarps warps' online-softmax results into out[0, dim): each warp's
// state and its accumulator, lane holding elements lane, lane + 32, ... (kPerLane of them).
// Called by all kAttentionThreads threads of a block; `smem` is AttentionSharedBytes(dim):
// [kAttentionWarps][dim] accumulators, then the maxima, then the sums. A warp that saw no key
// has max -inf and sum 0 and is skipped.
template <int kPerLane>
__device__ void MergeWarps(const SoftmaxState& state, const float (&acc)[kPerLane], int64_t dim,
                           float* out, float* smem) {
  const int lane = threadIdx.x % kWarpSize;
  const int warp = threadIdx.x / kWarpSize;
  float* warp_acc = smem;
  float* warp_max = smem + kAttentionWarps * dim;
  float* warp_sum = warp_max + kAttentionWarps;
#pragma unroll
  for (int j = 0; j < kPerLane; ++j) {
    const int64_t d = lane + j * kWarpSize;
    if (d < dim) {
      warp_acc[warp * dim + d] = acc[j];
    }
  }
  if (lane == 0) {
    warp_max[warp] = state.max;
    warp_sum[warp] = state.sum;
  }
  __syncthreads();
  float global_max = -INFINITY;
  for (int w = 0; w < kAttentionWarps; ++w) {
    global_max = fmaxf(global_max, warp_max[w]);
  }
  float total = 0.0f;
  float factor[kAttentionWarps];
  for (int w = 0; w < kAttentionWarps; ++w) {
    factor[w] = WarpMergeFactor(SoftmaxState{warp_max[w], warp_sum[w]}, global_max);
    total += warp_sum[w] * factor[w];
  }
  for (int64_t d = threadIdx.x; d < dim; d += blockDim.x) {
    float o = 0.0f;
    for (int w = 0; w < kAttentionWarps; ++w) {
      o += warp_acc[w * dim + d] * factor[w];
    }
    out[d] = o / total;
  }
}

// out[0, head_dim) = softmax_t(scale * q . K[t]) V[t] over keys t in [0, num_keys), keys read
// through `table` (this sequence's block table row). Called by all kAttentionThreads threads of
// a block; `smem` is AttentionSharedBytes(head_dim) of dynamic shared memory.
__device__ void AttendRow(const KvCacheView& c, const int32_t* table, int64_t kv_head,
                          const float* q, int64_t num_keys, float scale, float* out, float* smem) {
  const int lane = threadIdx.x % kWarpSize;
  const int warp = threadIdx.x / kWarpSize;
  const int64_t head_dim = c.head_dim;
  float qr[kMaxDimsPerLane];
  float acc[kMaxDimsPerLane];
#pragma unroll
  for (int j = 0; j < kMaxDimsPerLane; ++j) {
    const int64_t d = lane + j * kWarpSize;
    qr[j] = d < head_dim ? q[d] * scale : 0.0f;
    acc[j] = 0.0f;
  }
  const bool i4 = c.dtype == DType::kI4;
  const bool rotated = KvRotated(c.dtype, head_dim);
  const int group = static_cast<int>(KvScaleGroup(c.dtype, head_dim));
  if (rotated) {  // (lane l holds element l of a 32-element stretch: whole groups)
#pragma unroll
    for (int j = 0; j < kMaxDimsPerLane; ++j) {
      qr[j] = WarpHadamard(qr[j], group);
    }
  }
  SoftmaxState state;
  // Warp w takes keys w, w + kAttentionWarps, ... (all lanes of a warp see the same key, so
  // the shuffles below never diverge).
  for (int64_t t = warp; t < num_keys; t += kAttentionWarps) {
    const int64_t block_id = table[t / c.block_size];
    const int64_t k_off = KvElementOffset(c, block_id, kv_head, t, /*value=*/false);
    if (i4) {  // code * its group's scale, one multiply as on the CPU
      float dot = 0.0f;
#pragma unroll
      for (int j = 0; j < kMaxDimsPerLane; ++j) {
        const int64_t d = lane + j * kWarpSize;
        if (d < head_dim) {
          dot += qr[j] * __fmul_rn(KvI4Code(c.base, k_off, d),
                                   KvI4Scale(c, block_id, kv_head, t, /*value=*/false, d / group));
        }
      }
      dot = WarpReduceSum(dot);
      const SoftmaxStep step = OnlineSoftmaxUpdate(&state, dot);
#pragma unroll
      for (int j = 0; j < kMaxDimsPerLane; ++j) {
        const int64_t d = lane + j * kWarpSize;
        if (d < head_dim) {
          acc[j] = acc[j] * step.correction +
                   step.weight *
                       __fmul_rn(KvI4Code(c.base, k_off + c.kv_stride, d),
                                 KvI4Scale(c, block_id, kv_head, t, /*value=*/true, d / group));
        }
      }
      continue;
    }
    // Quantized caches: code * the row's scale, one multiply as on the CPU (else * 1).
    const float k_scale = KvRowScale(c, block_id, kv_head, t, /*value=*/false);
    const float v_scale = KvRowScale(c, block_id, kv_head, t, /*value=*/true);
    float dot = 0.0f;
#pragma unroll
    for (int j = 0; j < kMaxDimsPerLane; ++j) {
      const int64_t d = lane + j * kWarpSize;
      if (d < head_dim) {
        dot += qr[j] * __fmul_rn(LoadKv(c.base, c.dtype, k_off + d), k_scale);
      }
    }
    dot = WarpReduceSum(dot);  // every lane holds the score and updates the same state
    const SoftmaxStep step = OnlineSoftmaxUpdate(&state, dot);
    const int64_t v_off = k_off + c.kv_stride;
#pragma unroll
    for (int j = 0; j < kMaxDimsPerLane; ++j) {
      const int64_t d = lane + j * kWarpSize;
      if (d < head_dim) {
        acc[j] = acc[j] * step.correction +
                 step.weight * __fmul_rn(LoadKv(c.base, c.dtype, v_off + d), v_scale);
      }
    }
  }
  if (rotated) {  // the values were summed rotated: rotate back (linear, so before the merge)
#pragma unroll
    for (int j = 0; j < kMaxDimsPerLane; ++j) {
      acc[j] = WarpHadamard(acc[j], group);
    }
  }
  MergeWarps(state, acc, head_dim, out, smem);
}

// grid = num_tokens * num_heads (AttentionLaunch): block b is token b / num_heads, query head
// b % num_heads, attending positions [0, start_pos + token].
__global__ void PrefillAttentionKernel(PrefillAttentionParams p, float scale) {
  extern __shared__ float smem[];
  const RowHead rh = RowHeadAt(blockIdx.x, p.num_heads);
  const int64_t head_dim = p.cache.head_dim;
  AttendRow(p.cache, p.block_table, KvHeadOf(rh.head, p.num_heads, p.cache.num_kv_heads),
            p.q + rh.row * p.q_token_stride + rh.head * head_dim,
            PrefillNumKeys(p.start_pos, rh.row), scale,
            p.out + rh.row * p.out_token_stride + rh.head * head_dim, smem);
}

// grid = num_tokens * num_heads (LatentAttentionLaunch): block b is token b / num_heads, query
// head b % num_heads, scoring its keys [0, positions[token]] (whole entries, LatentEntryElement)
// and summing their first value_dim elements; AttendRow's warps, online softmax and merge.
__global__ void __launch_bounds__(kAttentionThreads)
    LatentAttentionKernel(LatentAttentionParams p, float scale) {
  extern __shared__ float smem[];
  const KvCacheView& c = p.cache;
  const RowHead rh = RowHeadAt(blockIdx.x, p.num_heads);
  const int lane = threadIdx.x % kWarpSize;
  const int warp = threadIdx.x / kWarpSize;
  const int64_t entry = LatentEntryDim(c);
  const float* q = p.q + rh.row * p.q_token_stride + rh.head * entry;
  float qr[kMaxLatentDimsPerLane];
  float acc[kMaxLatentDimsPerLane];
#pragma unroll
  for (int j = 0; j < kMaxLatentDimsPerLane; ++j) {
    const int64_t e = lane + j * kWarpSize;
    qr[j] = e < entry ? q[e] * scale : 0.0f;
    acc[j] = 0.0f;
  }
  const int64_t seq = p.token_seq != nullptr ? p.token_seq[rh.row] : 0;
  const int32_t* table =
      p.block_tables + BlockTableIndex(seq, p.max_blocks_per_seq, 0, c.block_size);
  const int64_t num_keys = static_cast<int64_t>(p.positions[rh.row]) + 1;
  SoftmaxState state;
  for (int64_t t = warp; t < num_keys; t += kAttentionWarps) {
    const int64_t block_id = table[t / c.block_size];
    float x[kMaxLatentDimsPerLane];
    float dot = 0.0f;
#pragma unroll
    for (int j = 0; j < kMaxLatentDimsPerLane; ++j) {
      const int64_t e = lane + j * kWarpSize;
      x[j] = e < entry ? LatentEntryElement(c, block_id, t, e) : 0.0f;
      dot += qr[j] * x[j];
    }
    dot = WarpReduceSum(dot);  // every lane holds the score and updates the same state
    const SoftmaxStep step = OnlineSoftmaxUpdate(&state, dot);
#pragma unroll
    for (int j = 0; j < kMaxLatentDimsPerLane; ++j) {
      acc[j] = acc[j] * step.correction + step.weight * x[j];
    }
  }
  MergeWarps(state, acc, p.value_dim, p.out + rh.row * p.out_token_stride + rh.head * p.value_dim,
             smem);
}

// Stages the K and V rows of keys [first_key, first_key + rows) of kv head `kv_head` into
// ks and vs ([chunk_keys][head_dim] f32 each, row r = key first_key + r), widened (and for
// i8/fp8 multiplied by the row's scale, one f32 multiply as on the CPU). kVector: 16-byte
// loads of a kVecDType (= c.dtype) cache, DecodeVectorLoads holds; else one element per load,
// c.dtype decided at run time (kVecDType unused). A compile-time dtype keeps the hot loop free
// of the other dtypes' conversions.
template <bool kVector, DType kVecDType>
__device__ void StageKvChunk(const KvCacheView& c, const int32_t* table, int64_t kv_head,
                             int64_t first_key, int rows, float* ks, float* vs) {
  const int head_dim = static_cast<int>(c.head_dim);
  const DType dtype = kVector ? kVecDType : c.dtype;
  const DecodeStageShape shape = DecodeStageShapeOf(dtype, head_dim, kVector);
  for (int i = static_cast<int>(threadIdx.x); i < rows * shape.units_per_row; i += kDecodeThreads) {
    const DecodeStageUnit u = DecodeStageUnitAt(i, shape);
    const int64_t t = first_key + u.row;
    const int64_t block_id = table[t / c.block_size];
    const int64_t k_off = KvElementOffset(c, block_id, kv_head, t, /*value=*/false) + u.elem;
    float* k_dst = ks + u.row * head_dim + u.elem;
    float* v_dst = vs + u.row * head_dim + u.elem;
    if constexpr (kVector) {
      const char* base = static_cast<const char*>(c.base);
      const int64_t es = DTypeSize(dtype);
      const uint4 kw = *reinterpret_cast<const uint4*>(base + k_off * es);
      const uint4 vw = *reinterpret_cast<const uint4*>(base + (k_off + c.kv_stride) * es);
      // Widened in registers, then stored as float4s: k_dst and v_dst are 16-byte aligned (the
      // layout's regions are, head_dim is a multiple of 4 and u.elem of 4 or 8 here), and
      // whole-vector stores keep the threads of a warp off each other's banks.
      constexpr int kElems = kDecodeVectorBytes / DTypeSize(kVecDType);  // 4 or 8
      constexpr int n = static_cast<int>(KvWordElems(kVecDType));
      float k[kElems], v[kElems];
      UnpackKvWord(kw.x, dtype, k);
      UnpackKvWord(kw.y, dtype, k + n);
      UnpackKvWord(kw.z, dtype, k + 2 * n);
      UnpackKvWord(kw.w, dtype, k + 3 * n);
      UnpackKvWord(vw.x, dtype, v);
      UnpackKvWord(vw.y, dtype, v + n);
      UnpackKvWord(vw.z, dtype, v + 2 * n);
      UnpackKvWord(vw.w, dtype, v + 3 * n);
#pragma unroll
      for (int j = 0; j < kElems; j += 4) {
        *reinterpret_cast<float4*>(k_dst + j) = make_float4(k[j], k[j + 1], k[j + 2], k[j + 3]);
        *reinterpret_cast<float4*>(v_dst + j) = make_float4(v[j], v[j + 1], v[j + 2], v[j + 3]);
      }
    } else if (c.dtype == DType::kI4) {  // code * its group's scale (still rotated)
      const int64_t row = k_off - u.elem;
      const int64_t g = u.elem / KvScaleGroup(DType::kI4, head_dim);
      *k_dst = __fmul_rn(KvI4Code(c.base, row, u.elem),
                         KvI4Scale(c, block_id, kv_head, t, /*value=*/false, g));
      *v_dst = __fmul_rn(KvI4Code(c.base, row + c.kv_stride, u.elem),
                         KvI4Scale(c, block_id, kv_head, t, /*value=*/true, g));
    } else {
      const float k = LoadKv(c.base, c.dtype, k_off);
      const float v = LoadKv(c.base, c.dtype, k_off + c.kv_stride);
      if (IsQuantizedKvDType(c.dtype)) {
        *k_dst = __fmul_rn(k, KvRowScale(c, block_id, kv_head, t, /*value=*/false));
        *v_dst = __fmul_rn(v, KvRowScale(c, block_id, kv_head, t, /*value=*/true));
      } else {
        *k_dst = k;
        *v_dst = v;
      }
    }
  }
}

// grid and block: DecodeSplitLaunch (DecodeSplitBlockAt). Attends the split's keys for the
// tile's query heads with an online softmax over chunks (f32), and writes each head's
// unnormalised (acc, max, sum) to the workspace record (seq, head, split).
template <bool kVector, DType kVecDType>
__global__ void __launch_bounds__(kDecodeThreads)
    DecodeSplitKernel(DecodeAttentionParams p, DecodeGeometry g, float scale) {
  extern __shared__ __align__(16) float decode_smem[];
  float* smem = decode_smem;
  const KvCacheView& c = p.cache;
  const DecodeSplitBlock blk = DecodeSplitBlockAt(blockIdx.x, g, c.num_kv_heads);
  const KeyRange keys =
      DecodeSplitKeys(blk.split, g.split_tokens, p.context_lens[blk.seq], g.num_splits);
  if (keys.begin >= keys.end) {
    return;  // the whole block: no __syncthreads has run yet
  }
  const HeadRange heads = DecodeTileHeads(blk.kv_head, blk.head_tile, g.group);
  const int count = static_cast<int>(heads.count);
  const int head_dim = static_cast<int>(c.head_dim);
  const int chunk_keys = static_cast<int>(g.chunk_keys);
  const DecodeSmemLayout sl = DecodeSmemLayoutOf(g, head_dim);
  float* qs = smem + sl.q;
  float* ks = smem + sl.k;
  float* vs = smem + sl.v;
  float* ps = smem + sl.p;
  float* run_max = smem + sl.max;
  float* run_sum = smem + sl.sum;
  float* corr = smem + sl.corr;
  const int tid = static_cast<int>(threadIdx.x);
  const int lane = tid % kWarpSize;
  const int warp = tid / kWarpSize;
  const int32_t* table =
      p.block_tables + BlockTableIndex(blk.seq, p.max_blocks_per_seq, 0, c.block_size);
  const float* q = p.q + blk.seq * p.q_seq_stride + heads.first * head_dim;
  const int tile_elems = count * head_dim;  // the tile's heads are adjacent in q
  for (int i = tid; i < tile_elems; i += kDecodeThreads) {
    qs[i] = q[i] * scale;
  }
  if (KvRotated(c.dtype, head_dim)) {  // an i4 cache: score the rotated query (one thread a group)
    const int group = static_cast<int>(KvScaleGroup(c.dtype, head_dim));
    __syncthreads();
    for (int i = tid; i < tile_elems / group; i += kDecodeThreads) {
      HadamardRotateRn(qs + i * group, group);
    }
  }
  if (tid < count) {
    run_max[tid] = -INFINITY;
    run_sum[tid] = 0.0f;
  }
  // Thread t owns accumulator elements t + j * kDecodeThreads of [count][head_dim].
  float acc[kDecodeMaxAccPerThread];
#pragma unroll
  for (int j = 0; j < kDecodeMaxAccPerThread; ++j) {
    acc[j] = 0.0f;
  }
  for (int64_t first = keys.begin; first < keys.end; first += chunk_keys) {
    const int rows =
        static_cast<int>(keys.end - first < chunk_keys ? keys.end - first : chunk_keys);
    StageKvChunk<kVector, kVecDType>(c, table, blk.kv_head, first, rows, ks, vs);
    __syncthreads();  // the chunk (and, the first time, qs and the running state) is in place
    // Scores: warp w takes (head, key) items w, w + kDecodeWarps, ...; lanes split head_dim.
    for (int i = warp; i < count * rows; i += kDecodeWarps) {
      const LocalRowCol hk = LocalRowColAt(i, rows);
      float dot = 0.0f;
      for (int d = lane; d < head_dim; d += kWarpSize) {
        dot += qs[hk.row * head_dim + d] * ks[hk.col * head_dim + d];
      }
      dot = WarpReduceSum(dot);
      if (lane == 0) {
        ps[hk.row * chunk_keys + hk.col] = dot;
      }
    }
    __syncthreads();
    // Softmax step: warp w takes heads w, w + kDecodeWarps, ...; scores become weights.
    for (int h = warp; h < count; h += kDecodeWarps) {
      float* row = ps + h * chunk_keys;
      float chunk_max = -INFINITY;
      for (int r = lane; r < rows; r += kWarpSize) {
        chunk_max = fmaxf(chunk_max, row[r]);
      }
      chunk_max = WarpReduceMax(chunk_max);
      const SoftmaxRescale rs = SoftmaxRescaleOf(run_max[h], chunk_max);
      float sum = 0.0f;
      for (int r = lane; r < rows; r += kWarpSize) {
        const float w = expf(row[r] - rs.max);
        row[r] = w;
        sum += w;
      }
      sum = WarpReduceSum(sum);
      __syncwarp();  // every lane has read run_max[h] before lane 0 writes it
      if (lane == 0) {
        run_sum[h] = run_sum[h] * rs.correction + sum;
        run_max[h] = rs.max;
        corr[h] = rs.correction;
      }
    }
    __syncthreads();
#pragma unroll
    for (int j = 0; j < kDecodeMaxAccPerThread; ++j) {
      const int e = tid + j * kDecodeThreads;
      if (e < tile_elems) {
        const LocalRowCol hd = LocalRowColAt(e, head_dim);  // (head in the tile, dim)
        const float* w = ps + hd.row * chunk_keys;
        float a = acc[j] * corr[hd.row];
        for (int r = 0; r < rows; ++r) {
          a += w[r] * vs[r * head_dim + hd.col];
        }
        acc[j] = a;
      }
    }
    __syncthreads();  // the next chunk overwrites ks, vs and ps
  }
  float* ws = static_cast<float*>(p.workspace);
#pragma unroll
  for (int j = 0; j < kDecodeMaxAccPerThread; ++j) {
    const int e = tid + j * kDecodeThreads;
    if (e < tile_elems) {
      const LocalRowCol hd = LocalRowColAt(e, head_dim);
      const int64_t partial =
          DecodePartialIndex(blk.seq, heads.first + hd.row, blk.split, p.num_heads, g.num_splits);
      ws[DecodeAccOffset(partial, head_dim, hd.col)] = acc[j];
    }
  }
  if (tid < count) {
    const int64_t partial =
        DecodePartialIndex(blk.seq, heads.first + tid, blk.split, p.num_heads, g.num_splits);
    ws[DecodeMaxOffset(partial, head_dim)] = run_max[tid];
    ws[DecodeSumOffset(partial, head_dim)] = run_sum[tid];
  }
}

// grid and block: DecodeMergeLaunch. Block b merges the used splits of sequence
// b / num_heads, query head b % num_heads, into out.
__global__ void DecodeMergeKernel(DecodeAttentionParams p, DecodeGeometry g) {
  const RowHead rh = RowHeadAt(blockIdx.x, p.num_heads);
  const int64_t head_dim = p.cache.head_dim;
  const int64_t used = DecodeUsedSplits(p.context_lens[rh.row], g.split_tokens, g.num_splits);
  const int64_t first = DecodePartialIndex(rh.row, rh.head, 0, p.num_heads, g.num_splits);
  const float* ws = static_cast<const float*>(p.workspace);
  const DecodeMergeTotals totals = DecodeMergeTotalsOf(ws, first, used, head_dim);
  float* out = p.out + rh.row * p.out_seq_stride + rh.head * head_dim;
  if (KvRotated(p.cache.dtype, head_dim)) {
    // An i4 cache: the splits summed rotated values; rotate the merged output back.
    __shared__ float merged[kMaxAttentionHeadDim];
    const int64_t group = KvScaleGroup(p.cache.dtype, head_dim);
    for (int64_t d = threadIdx.x; d < head_dim; d += blockDim.x) {
      merged[d] = DecodeMergeElement(ws, first, used, head_dim, totals, d);
    }
    __syncthreads();
    for (int64_t i = threadIdx.x; i < head_dim / group; i += blockDim.x) {
      HadamardRotateRn(merged + i * group, group);
    }
    __syncthreads();
    for (int64_t d = threadIdx.x; d < head_dim; d += blockDim.x) {
      out[d] = merged[d];
    }
    return;
  }
  for (int64_t d = threadIdx.x; d < head_dim; d += blockDim.x) {
    out[d] = DecodeMergeElement(ws, first, used, head_dim, totals, d);
  }
}

bool Launchable(const LaunchShape& s) {
  return s.grid > 0 && s.grid <= kMaxGridX && s.shared_bytes <= 48 * 1024;
}

}  // namespace

cudaError_t LaunchWriteKv(const WriteKvParams& p, cudaStream_t stream) {
  const LaunchShape s = WriteKvLaunch(p.num_tokens, p.cache.num_kv_heads, p.cache.head_dim);
  if (!Launchable(s)) {
    return cudaErrorInvalidConfiguration;
  }
  WriteKvKernel<<<static_cast<unsigned>(s.grid), s.threads, 0, stream>>>(p);
  return cudaGetLastError();
}

cudaError_t LaunchReadKv(const ReadKvParams& p, cudaStream_t stream) {
  const LaunchShape s = ReadKvLaunch(p.num_tokens, p.cache.num_kv_heads, p.cache.head_dim);
  if (!Launchable(s)) {
    return cudaErrorInvalidConfiguration;
  }
  ReadKvKernel<<<static_cast<unsigned>(s.grid), s.threads, 0, stream>>>(p);
  return cudaGetLastError();
}

cudaError_t LaunchPrefillAttention(const PrefillAttentionParams& p, cudaStream_t stream) {
  if (PrefillTcEligible(p)) {
    return LaunchPrefillAttentionTc(p, AttentionScale(p.scale, p.cache.head_dim), stream);
  }
  const LaunchShape s = AttentionLaunch(p.num_tokens, p.num_heads, p.cache.head_dim);
  if (!Launchable(s) || p.cache.head_dim > kMaxAttentionHeadDim) {
    return cudaErrorInvalidConfiguration;
  }
  PrefillAttentionKernel<<<static_cast<unsigned>(s.grid), s.threads,
                           static_cast<size_t>(s.shared_bytes), stream>>>(
      p, AttentionScale(p.scale, p.cache.head_dim));
  return cudaGetLastError();
}

cudaError_t LaunchDecodeAttention(const DecodeAttentionParams& p, cudaStream_t stream) {
  const KvCacheView& c = p.cache;
  const DecodeGeometry g = DecodeGeometryOf(p);
  const LaunchShape split = DecodeSplitLaunch(g, p.num_seqs, c.num_kv_heads, c.head_dim);
  const LaunchShape merge = DecodeMergeLaunch(p.num_seqs, p.num_heads);
  if (!Launchable(split) || !Launchable(merge) || c.head_dim > kMaxAttentionHeadDim ||
      p.workspace == nullptr ||
      p.workspace_bytes < DecodeWorkspaceBytes(p.num_seqs, p.num_heads, c.head_dim,
                                               p.max_blocks_per_seq, c.block_size)) {
    return cudaErrorInvalidConfiguration;
  }
  const float scale = AttentionScale(p.scale, c.head_dim);
  const unsigned grid = static_cast<unsigned>(split.grid);
  const size_t shared = static_cast<size_t>(split.shared_bytes);
  const bool vector = DecodeVectorLoads(c);
  if (vector && c.dtype == DType::kF32) {
    DecodeSplitKernel<true, DType::kF32><<<grid, split.threads, shared, stream>>>(p, g, scale);
  } else if (vector && c.dtype == DType::kBF16) {
    DecodeSplitKernel<true, DType::kBF16><<<grid, split.threads, shared, stream>>>(p, g, scale);
  } else if (vector && c.dtype == DType::kF16) {
    DecodeSplitKernel<true, DType::kF16><<<grid, split.threads, shared, stream>>>(p, g, scale);
  } else {
    DecodeSplitKernel<false, DType::kF32><<<grid, split.threads, shared, stream>>>(p, g, scale);
  }
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) {
    return err;
  }
  DecodeMergeKernel<<<static_cast<unsigned>(merge.grid), merge.threads, 0, stream>>>(p, g);
  return cudaGetLastError();
}

cudaError_t LaunchLatentAttention(const LatentAttentionParams& p, cudaStream_t stream) {
  const LaunchShape s = LatentAttentionLaunch(p.num_tokens, p.num_heads, p.value_dim);
  if (!Launchable(s)) {
    return cudaErrorInvalidConfiguration;
  }
  const float scale = AttentionScale(p.scale, LatentEntryDim(p.cache));
  LatentAttentionKernel<<<static_cast<unsigned>(s.grid), s.threads,
                          static_cast<size_t>(s.shared_bytes), stream>>>(p, scale);
  return cudaGetLastError();
}

}  // namespace pd::kernels::cuda
