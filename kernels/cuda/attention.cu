// Paged attention on CUDA: WriteKv, PrefillAttention (causal, one sequence) and DecodeAttention
// (one query per sequence). Simple and exact rather than fast: one thread block per (query row,
// query head), keys split over its warps with an online softmax in f32, the cache dtype
// (f32/bf16/f16, or i8/fp8 codes times their row's scale) decided per load at run time so
// there is one instantiation per kernel. Quantized rows are written by one thread each, with
// the reference's float operations, so the bytes equal the CPU's.
#include <cmath>

#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/device_utils.cuh"
#include "kernels/cuda/launch_config.h"
#include "kernels/cuda/prefill_tc.h"

namespace pd::kernels::cuda {
namespace {

// grid = num_tokens (WriteKvLaunch): block j writes token j's K and V rows, all kv heads.
__global__ void WriteKvKernel(WriteKvParams p) {
  const KvCacheView& c = p.cache;
  const int64_t j = blockIdx.x;
  const int64_t seq = p.token_seq != nullptr ? p.token_seq[j] : 0;
  const int64_t pos = p.positions[j];
  const int64_t block_id =
      p.block_tables[BlockTableIndex(seq, p.max_blocks_per_seq, pos, c.block_size)];
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
  SoftmaxState state;
  // Warp w takes keys w, w + kAttentionWarps, ... (all lanes of a warp see the same key, so
  // the shuffles below never diverge).
  for (int64_t t = warp; t < num_keys; t += kAttentionWarps) {
    const int64_t block_id = table[t / c.block_size];
    const int64_t k_off = KvElementOffset(c, block_id, kv_head, t, /*value=*/false);
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
  // Merge the warps: smem = [kAttentionWarps][head_dim] accumulators, then the maxima, then
  // the sums. A warp that saw no key has max -inf and sum 0 and is skipped.
  float* warp_acc = smem;
  float* warp_max = smem + kAttentionWarps * head_dim;
  float* warp_sum = warp_max + kAttentionWarps;
#pragma unroll
  for (int j = 0; j < kMaxDimsPerLane; ++j) {
    const int64_t d = lane + j * kWarpSize;
    if (d < head_dim) {
      warp_acc[warp * head_dim + d] = acc[j];
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
  for (int64_t d = threadIdx.x; d < head_dim; d += blockDim.x) {
    float o = 0.0f;
    for (int w = 0; w < kAttentionWarps; ++w) {
      o += warp_acc[w * head_dim + d] * factor[w];
    }
    out[d] = o / total;
  }
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

// grid = num_seqs * num_heads (AttentionLaunch): block b is sequence b / num_heads, query head
// b % num_heads, attending its context_lens[seq] keys.
__global__ void DecodeAttentionKernel(DecodeAttentionParams p, float scale) {
  extern __shared__ float smem[];
  const RowHead rh = RowHeadAt(blockIdx.x, p.num_heads);
  const int64_t head_dim = p.cache.head_dim;
  AttendRow(p.cache,
            p.block_tables + BlockTableIndex(rh.row, p.max_blocks_per_seq, 0, p.cache.block_size),
            KvHeadOf(rh.head, p.num_heads, p.cache.num_kv_heads),
            p.q + rh.row * p.q_seq_stride + rh.head * head_dim, p.context_lens[rh.row], scale,
            p.out + rh.row * p.out_seq_stride + rh.head * head_dim, smem);
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
  const LaunchShape s = AttentionLaunch(p.num_seqs, p.num_heads, p.cache.head_dim);
  if (!Launchable(s) || p.cache.head_dim > kMaxAttentionHeadDim) {
    return cudaErrorInvalidConfiguration;
  }
  DecodeAttentionKernel<<<static_cast<unsigned>(s.grid), s.threads,
                          static_cast<size_t>(s.shared_bytes), stream>>>(
      p, AttentionScale(p.scale, p.cache.head_dim));
  return cudaGetLastError();
}

}  // namespace pd::kernels::cuda
