// Prefill attention on tensor cores (issue #16 item 5); the algorithm, layout and eligibility
// are in kernels/cuda/prefill_tc.h. WMMA 16x16x16 bf16 fragments with f32 accumulation: every
// matrix goes through shared memory, so no fragment's register layout is assumed. The per-row
// softmax runs one thread per query row (threads 0-63).
#include <cuda_bf16.h>
#include <mma.h>

#include <cmath>
#include <cstdint>

#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/launch_config.h"
#include "kernels/cuda/prefill_tc.h"

namespace pd::kernels::cuda {
namespace {

namespace wmma = nvcuda::wmma;
using Bf16 = __nv_bfloat16;

constexpr int kRows = kPrefillTcQueries;
constexpr int kKeys = kPrefillTcKeys;
constexpr int kF = kPrefillTcFrag;

// Loads keys [first, first + 64) of kv head `kv_head` (K, or V when `value`) into tile[64][D]
// as stored (bf16), 16 bytes per access; keys at or past num_keys are zero (their weights are
// 0, and 0 x garbage could be NaN).
__device__ void LoadKvTile(const KvCacheView& c, const int32_t* table, int64_t kv_head,
                           int64_t first, int64_t num_keys, bool value, Bf16* tile) {
  const int64_t d = c.head_dim;
  const int64_t chunks = d / 8;  // 16-byte pieces per row
  const uint16_t* base = static_cast<const uint16_t*>(c.base);
  uint4* out = reinterpret_cast<uint4*>(tile);
  for (int64_t i = threadIdx.x; i < kKeys * chunks; i += blockDim.x) {
    const int64_t k = i / chunks, piece = i % chunks;
    const int64_t key = first + k;
    uint4 v = make_uint4(0, 0, 0, 0);
    if (key < num_keys) {
      const int64_t block_id = table[key / c.block_size];
      const int64_t off = KvElementOffset(c, block_id, kv_head, key, value) + piece * 8;
      v = *reinterpret_cast<const uint4*>(base + off);
    }
    out[i] = v;  // row k, elements [8 piece, 8 piece + 8): i = k * chunks + piece
  }
}

__global__ void __launch_bounds__(kPrefillTcThreads)
    PrefillTcKernel(PrefillAttentionParams p, float scale) {
  extern __shared__ __align__(128) unsigned char smem[];
  const int64_t d = p.cache.head_dim;
  const PrefillTcSmem lay = PrefillTcLayout(d);
  Bf16* qs = reinterpret_cast<Bf16*>(smem + lay.q);
  Bf16* kvs = reinterpret_cast<Bf16*>(smem + lay.kv);
  float* ss = reinterpret_cast<float*>(smem + lay.s);
  Bf16* ps = reinterpret_cast<Bf16*>(smem + lay.p);
  float* os = reinterpret_cast<float*>(smem + lay.o);
  float* ms = reinterpret_cast<float*>(smem + lay.m);
  float* ls = reinterpret_cast<float*>(smem + lay.l);

  const RowHead rh = RowHeadAt(blockIdx.x, p.num_heads);
  const int64_t tile = rh.row, head = rh.head;
  const int64_t q0 = tile * kRows;
  const int64_t kv_head = KvHeadOf(head, p.num_heads, p.cache.num_kv_heads);
  const int64_t num_keys = p.start_pos + p.num_tokens;
  const int warp = threadIdx.x / kWarpSize;

  // Q rounded to bf16 (rows past the sequence are 0), O = 0, m = -inf, l = 0.
  for (int64_t i = threadIdx.x; i < kRows * d; i += blockDim.x) {
    const int64_t r = i / d, e = i % d;
    const int64_t row = q0 + r;
    const float v = row < p.num_tokens ? p.q[row * p.q_token_stride + head * d + e] : 0.0f;
    qs[i] = __float2bfloat16_rn(v);
    os[i] = 0.0f;
  }
  for (int r = threadIdx.x; r < kRows; r += blockDim.x) {
    ms[r] = -INFINITY;
    ls[r] = 0.0f;
  }
  __syncthreads();

  const int64_t tiles = PrefillTcKeyTiles(p.start_pos, tile, p.num_tokens);
  for (int64_t kt = 0; kt < tiles; ++kt) {
    const int64_t first = kt * kKeys;
    LoadKvTile(p.cache, p.block_table, kv_head, first, num_keys, /*value=*/false, kvs);
    __syncthreads();
    // S[16 warp .. +16][0, 64) = Q K^T: K^T is K read column-major.
    for (int nf = 0; nf < kKeys / kF; ++nf) {
      wmma::fragment<wmma::accumulator, kF, kF, kF, float> acc;
      wmma::fill_fragment(acc, 0.0f);
      for (int64_t kf = 0; kf < d / kF; ++kf) {
        wmma::fragment<wmma::matrix_a, kF, kF, kF, Bf16, wmma::row_major> a;
        wmma::fragment<wmma::matrix_b, kF, kF, kF, Bf16, wmma::col_major> b;
        wmma::load_matrix_sync(a, qs + warp * kF * d + kf * kF, static_cast<unsigned>(d));
        wmma::load_matrix_sync(b, kvs + nf * kF * d + kf * kF, static_cast<unsigned>(d));
        wmma::mma_sync(acc, a, b, acc);
      }
      wmma::store_matrix_sync(ss + warp * kF * kKeys + nf * kF, acc, kKeys, wmma::mem_row_major);
    }
    __syncthreads();  // S complete; K no longer read
    LoadKvTile(p.cache, p.block_table, kv_head, first, num_keys, /*value=*/true, kvs);
    if (threadIdx.x < kRows) {
      const int r = threadIdx.x;
      const int64_t row = q0 + r;
      const int visible = row < p.num_tokens ? PrefillTcVisible(p.start_pos, row, first) : 0;
      float* srow = ss + r * kKeys;
      const float corr = TileSoftmaxRow(srow, kKeys, visible, scale, &ms[r], &ls[r]);
      for (int j = 0; j < kKeys; ++j) {
        ps[r * kKeys + j] = __float2bfloat16_rn(srow[j]);
      }
      if (corr != 1.0f) {
        for (int64_t e = 0; e < d; ++e) {
          os[r * d + e] *= corr;
        }
      }
    }
    __syncthreads();  // V loaded, P and the rescaled O ready
    // O[16 warp .. +16][0, D) += P V.
    for (int64_t nf = 0; nf < d / kF; ++nf) {
      wmma::fragment<wmma::accumulator, kF, kF, kF, float> acc;
      float* o = os + warp * kF * d + nf * kF;
      wmma::load_matrix_sync(acc, o, static_cast<unsigned>(d), wmma::mem_row_major);
      for (int kf = 0; kf < kKeys / kF; ++kf) {
        wmma::fragment<wmma::matrix_a, kF, kF, kF, Bf16, wmma::row_major> a;
        wmma::fragment<wmma::matrix_b, kF, kF, kF, Bf16, wmma::row_major> b;
        wmma::load_matrix_sync(a, ps + warp * kF * kKeys + kf * kF, kKeys);
        wmma::load_matrix_sync(b, kvs + kf * kF * d + nf * kF, static_cast<unsigned>(d));
        wmma::mma_sync(acc, a, b, acc);
      }
      wmma::store_matrix_sync(o, acc, static_cast<unsigned>(d), wmma::mem_row_major);
    }
    __syncthreads();  // before the next tile overwrites K/V, S and P
  }
  for (int64_t i = threadIdx.x; i < kRows * d; i += blockDim.x) {
    const int64_t r = i / d, e = i % d;
    const int64_t row = q0 + r;
    if (row < p.num_tokens) {
      p.out[row * p.out_token_stride + head * d + e] = os[i] / ls[r];
    }
  }
}

}  // namespace

cudaError_t LaunchPrefillAttentionTc(const PrefillAttentionParams& p, float scale,
                                     cudaStream_t stream) {
  const LaunchShape s = PrefillTcLaunch(p.num_tokens, p.num_heads, p.cache.head_dim);
  if (s.grid <= 0 || s.grid > kMaxGridX) {
    return cudaErrorInvalidConfiguration;
  }
  // Above 48 KiB of dynamic shared memory a kernel must opt in (sm_80 and sm_90 allow it).
  const cudaError_t attr =
      cudaFuncSetAttribute(PrefillTcKernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           static_cast<int>(s.shared_bytes));
  if (attr != cudaSuccess) {
    return attr;
  }
  PrefillTcKernel<<<static_cast<unsigned>(s.grid), s.threads, static_cast<size_t>(s.shared_bytes),
                    stream>>>(p, scale);
  return cudaGetLastError();
}

}  // namespace pd::kernels::cuda
