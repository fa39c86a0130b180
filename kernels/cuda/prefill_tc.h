// Prefill attention on tensor cores (issue #16 item 5): the tiling, shared-memory layout and
// per-row online-softmax step of kernels/cuda/prefill_tc.cu, as plain functions that g++
// compiles, so kernels_cuda_launch_test emulates the kernel tile by tile on the host (with the
// same bf16 roundings) and compares it with kernels/reference.
//
// The kernel: one block of 4 warps per (tile of kPrefillTcQueries query rows, query head). Q is
// rounded to bf16 once into shared memory; the block walks the key tiles of kPrefillTcKeys keys
// the tile can see (causal: tiles past the last row's position are never loaded), and for each
//   S = Q K^T        bf16 x bf16 -> f32 on the tensor cores (WMMA 16x16x16), K from the cache
//   P, m, l          per row: the online softmax (TileSoftmaxRow), masking invisible keys
//   O = O * corr + P V   P rounded to bf16, V from the cache, f32 accumulation in shared memory
// and writes O / l. Only bf16 caches qualify (K and V are then used exactly as stored); the
// results differ from the CPU op by Q's and P's rounding to bf16 (about 1e-2 relative at
// worst). Callers opt in (PrefillAttentionParams::tensor_cores); other shapes and dtypes run the
// exact kernel of attention.cu.
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/attention_params.h"
#include "kernels/cuda/launch_config.h"

namespace pd::kernels::cuda {

inline constexpr int kPrefillTcQueries = 64;  // query rows per block: 16 per warp
inline constexpr int kPrefillTcKeys = 64;     // keys per tile
inline constexpr int kPrefillTcWarps = 4;
inline constexpr int kPrefillTcThreads = kPrefillTcWarps * kWarpSize;
inline constexpr int kPrefillTcFrag = 16;  // WMMA tile edge
inline constexpr int64_t kPrefillTcMaxHeadDim = 128;
static_assert(kPrefillTcQueries == kPrefillTcWarps * kPrefillTcFrag, "16 query rows per warp");

// Whether the tensor-core kernel takes a prefill: bf16 cache, head_dim a multiple of 16 up to
// 128, and every K/V row 16-byte aligned (the tile loads are 16 bytes = 8 values).
inline bool PrefillTcEligible(const PrefillAttentionParams& p) {
  const KvCacheView& c = p.cache;
  const int64_t d = c.head_dim;
  return p.tensor_cores && c.dtype == DType::kBF16 && d % kPrefillTcFrag == 0 && d > 0 &&
         d <= kPrefillTcMaxHeadDim && reinterpret_cast<uintptr_t>(c.base) % 16 == 0 &&
         c.block_stride % 8 == 0 && c.layer_stride % 8 == 0 && c.kv_stride % 8 == 0 &&
         c.head_stride % 8 == 0;
}

// Byte offsets of the block's dynamic shared memory, each 128-byte aligned (WMMA pointers need
// 32): Q [64][D] bf16, K or V tile [64][D] bf16, S [64][64] f32, P [64][64] bf16, O [64][D] f32,
// then the rows' running max m [64] and sum l [64] (f32).
struct PrefillTcSmem {
  int64_t q = 0, kv = 0, s = 0, p = 0, o = 0, m = 0, l = 0, total = 0;
};
constexpr int64_t AlignUp128(int64_t x) { return (x + 127) / 128 * 128; }
constexpr PrefillTcSmem PrefillTcLayout(int64_t head_dim) {
  PrefillTcSmem l;
  const int64_t rows = kPrefillTcQueries, keys = kPrefillTcKeys;
  l.q = 0;
  l.kv = AlignUp128(l.q + rows * head_dim * 2);
  l.s = AlignUp128(l.kv + keys * head_dim * 2);
  l.p = AlignUp128(l.s + rows * keys * 4);
  l.o = AlignUp128(l.p + rows * keys * 2);
  l.m = AlignUp128(l.o + rows * head_dim * 4);
  l.l = AlignUp128(l.m + rows * 4);
  l.total = AlignUp128(l.l + rows * 4);
  return l;
}

// Blocks: ceil(num_tokens / 64) query tiles x num_heads; block b is tile b / num_heads, head
// b % num_heads (RowHeadAt).
constexpr LaunchShape PrefillTcLaunch(int64_t num_tokens, int64_t num_heads, int64_t head_dim) {
  return {CeilDiv(num_tokens, kPrefillTcQueries) * num_heads, kPrefillTcThreads,
          PrefillTcLayout(head_dim).total};
}

// Key tiles query tile `tile` must visit: its last row r = min(64 (tile + 1), num_tokens) - 1
// sees keys [0, start_pos + r], so tiles [0, ceil((start_pos + r + 1) / 64)); later ones are
// skipped (causal).
PD_HOST_DEVICE constexpr int64_t PrefillTcKeyTiles(int64_t start_pos, int64_t tile,
                                                   int64_t num_tokens) {
  const int64_t end = (tile + 1) * kPrefillTcQueries;
  const int64_t last = (end < num_tokens ? end : num_tokens) - 1;
  return CeilDiv(start_pos + last + 1, kPrefillTcKeys);
}

// Keys of the tile starting at key `first` visible to query row `row` (< num_tokens): the
// causal rule makes them a prefix of the tile, [first, min(first + 64, start_pos + row + 1)).
PD_HOST_DEVICE constexpr int PrefillTcVisible(int64_t start_pos, int64_t row, int64_t first) {
  const int64_t v = start_pos + row + 1 - first;
  return static_cast<int>(v < 0 ? 0 : (v > kPrefillTcKeys ? kPrefillTcKeys : v));
}

// One row's online-softmax step over a tile: s[0, n) holds the raw scores q.k of the tile's
// keys, the first `visible` of them visible. Folds them into the row's running max *m and sum
// *l (softmax of scale * score), overwrites s[j] with the unnormalised weight
// exp(scale s[j] - m_new) (0 for invisible keys) and returns the factor the row's accumulator
// must be multiplied by first (1 when the tile adds nothing).
PD_HOST_DEVICE inline float TileSoftmaxRow(float* s, int n, int visible, float scale, float* m,
                                           float* l) {
  float mx = *m;
  for (int j = 0; j < visible; ++j) {
    mx = fmaxf(mx, s[j] * scale);
  }
  if (visible == 0 || mx == -INFINITY) {
    for (int j = 0; j < n; ++j) {
      s[j] = 0.0f;
    }
    return 1.0f;
  }
  const float corr = expf(*m - mx);  // 0 for the first visible tile (m = -inf)
  float sum = 0.0f;
  for (int j = 0; j < n; ++j) {
    const float p = j < visible ? expf(s[j] * scale - mx) : 0.0f;
    s[j] = p;
    sum += p;
  }
  *l = *l * corr + sum;
  *m = mx;
  return corr;
}

}  // namespace pd::kernels::cuda
