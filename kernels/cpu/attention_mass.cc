// AttentionMass on the CPU, the float rule of kernels/attention_mass_params.h in its order
// (bitwise the reference's), in three steps:
//  1. scores: tiles of query rows of one kv head walk the keys a chunk at a time, each chunk
//     read from the cache once for the tile's rows (f32 keys in place), every (row, key) dot
//     product computed on its own (8 lanes: with AVX2, one vector register holds them);
//  2. each row's softmax (max, exp, sum over keys ascending);
//  3. each kv head's row of the mass adds its rows' weights in the rule's order (queries
//     ascending, then the group's heads) — in step 1's task when one tile holds all of them.
// Only step 3's order reaches the result, so how the rows are tiled and threaded never changes
// a bit.
// (GCC 12's AVX-512 headers trip -Wuninitialized once inlined, GCC PR 105593: silenced before
// the first inclusion of immintrin.h, as kernels/cpu/simd.h does.)
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && __GNUC__ < 13
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/kv_rows.h"
#include "kernels/cpu/parallel.h"

#if PD_CPU_X86
#include <immintrin.h>
#endif

namespace pd::kernels::cpu {
namespace {

// q . k as kernels/attention_mass_params.h writes it: eight running sums (lane l takes
// d = l (mod 8), in order), added pairwise.
float Dot(const float* q, const float* k, int64_t n) {
  float lane[8] = {};
  int64_t d = 0;
  for (; d + 8 <= n; d += 8) {
    for (int l = 0; l < 8; ++l) lane[l] += q[d + l] * k[d + l];
  }
  for (int l = 0; d < n; ++d, ++l) lane[l] += q[d] * k[d];
  return ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
}

// out[t] = scale * Dot(q, keys + t * stride, dim) for t < n.
void ScoreKeysScalar(const float* q, const float* keys, int64_t stride, int64_t n, int64_t dim,
                     float scale, float* out) {
  for (int64_t t = 0; t < n; ++t) out[t] = scale * Dot(q, keys + t * stride, dim);
}

#if PD_CPU_X86
// The same floats with one AVX2 register as the eight lanes: a multiply and an add per step,
// never fused (no FMA in this target, and the file is built with -ffp-contract=off), and the
// lanes added pairwise as the rule says. Four keys a pass share each load of q. dim % 8 == 0.
__attribute__((target("avx2"))) void ScoreKeysAvx2(const float* q, const float* keys,
                                                   int64_t stride, int64_t n, int64_t dim,
                                                   float scale, float* out) {
  int64_t t = 0;
  for (; t + 4 <= n; t += 4) {
    const float* k = keys + t * stride;
    __m256 a[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),
                   _mm256_setzero_ps()};
    for (int64_t d = 0; d < dim; d += 8) {
      const __m256 qv = _mm256_loadu_ps(q + d);
      for (int i = 0; i < 4; ++i) {
        a[i] = _mm256_add_ps(a[i], _mm256_mul_ps(qv, _mm256_loadu_ps(k + i * stride + d)));
      }
    }
    // hadd twice: per 128-bit half, [k0 (l0+l1)+(l2+l3), k1 .., k2 .., k3 ..] and the same of
    // lanes 4-7; the halves' sum is ((l0+l1)+(l2+l3)) + ((l4+l5)+(l6+l7)) for each key.
    const __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(a[0], a[1]), _mm256_hadd_ps(a[2], a[3]));
    const __m128 sums = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
    _mm_storeu_ps(out + t, _mm_mul_ps(_mm_set1_ps(scale), sums));
  }
  for (; t < n; ++t) {
    const float* k = keys + t * stride;
    __m256 a = _mm256_setzero_ps();
    for (int64_t d = 0; d < dim; d += 8) {
      a = _mm256_add_ps(a, _mm256_mul_ps(_mm256_loadu_ps(q + d), _mm256_loadu_ps(k + d)));
    }
    const __m256 h1 = _mm256_hadd_ps(a, a);
    const __m256 h = _mm256_hadd_ps(h1, h1);
    out[t] = scale * (_mm_cvtss_f32(_mm256_castps256_ps128(h)) +
                      _mm_cvtss_f32(_mm256_extractf128_ps(h, 1)));
  }
}
#endif

#if PD_CPU_X86
// _mm256_hadd_ps per 128-bit lane of a 512-bit register: [a0+a1, a2+a3, b0+b1, b2+b3].
__attribute__((target("avx512f"))) inline __m512 HaddLanes(__m512 a, __m512 b) {
  return _mm512_add_ps(_mm512_shuffle_ps(a, b, 0x88), _mm512_shuffle_ps(a, b, 0xDD));
}

// Two query rows at once with AVX-512: a register holds row 0's eight lanes in its low half
// and row 1's in its high half (`pair`: the rows packed so, [dim / 8][16]), each key's eight
// floats broadcast to both halves. Multiply, then add, then the rule's pairwise sums, as in
// ScoreKeysAvx2: the same floats. Keys past the last four: ScoreKeysAvx2 per row.
__attribute__((target("avx512f,avx512dq"))) void ScorePairAvx512(const float* pair, const float* q0,
                                                                 const float* q1, const float* keys,
                                                                 int64_t stride, int64_t n,
                                                                 int64_t dim, float scale,
                                                                 float* out0, float* out1) {
  const __m128 vscale = _mm_set1_ps(scale);
  int64_t t = 0;
  for (; t + 4 <= n; t += 4) {
    const float* k = keys + t * stride;
    __m512 a[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(),
                   _mm512_setzero_ps()};
    for (int64_t d = 0; d < dim; d += 8) {
      const __m512 qv = _mm512_loadu_ps(pair + 2 * d);
      for (int i = 0; i < 4; ++i) {
        const __m512 kv = _mm512_broadcast_f32x8(_mm256_loadu_ps(k + i * stride + d));
        a[i] = _mm512_add_ps(a[i], _mm512_mul_ps(qv, kv));
      }
    }
    // 128-bit lanes of h: row 0's (l0+l1)+(l2+l3) of the four keys, its (l4+l5)+(l6+l7), then
    // the same of row 1.
    const __m512 h = HaddLanes(HaddLanes(a[0], a[1]), HaddLanes(a[2], a[3]));
    _mm_storeu_ps(out0 + t, _mm_mul_ps(vscale, _mm_add_ps(_mm512_extractf32x4_ps(h, 0),
                                                          _mm512_extractf32x4_ps(h, 1))));
    _mm_storeu_ps(out1 + t, _mm_mul_ps(vscale, _mm_add_ps(_mm512_extractf32x4_ps(h, 2),
                                                          _mm512_extractf32x4_ps(h, 3))));
  }
  if (t < n) {
    ScoreKeysAvx2(q0, keys + t * stride, stride, n - t, dim, scale, out0 + t);
    ScoreKeysAvx2(q1, keys + t * stride, stride, n - t, dim, scale, out1 + t);
  }
}
#endif

void ScoreKeys(const float* q, const float* keys, int64_t stride, int64_t n, int64_t dim,
               float scale, float* out) {
#if PD_CPU_X86
  if (dim % 8 == 0 && ActiveIsa() != Isa::kScalar) {
    ScoreKeysAvx2(q, keys, stride, n, dim, scale, out);
    return;
  }
#endif
  ScoreKeysScalar(q, keys, stride, n, dim, scale, out);
}

// Key t of kv head g from the cache, widened as ReadKv widens it; a latent key is the K rows of
// every cache head, then their V rows.
void ReadKey(const AttentionMassParams& p, int64_t g, int64_t t, float* row) {
  const KvCacheView& c = *p.cache;
  if (!p.latent) {
    ReadKvRow(c, p.block_table, t, g, 0, row);
    return;
  }
  for (int kv = 0; kv < 2; ++kv) {
    for (int64_t h = 0; h < c.num_kv_heads; ++h) {
      ReadKvRow(c, p.block_table, t, h, kv, row + (kv * c.num_kv_heads + h) * c.head_dim);
    }
  }
}

constexpr int64_t kKeyChunk = 16;     // keys read at a time (never across a block)
constexpr int64_t kMaxTileRows = 16;  // query rows scored together

// A tile: rows [first, first + count) of kv head g's rows, which are (j, h) for the batch's
// queries j ascending and the group's heads h ascending.
struct Tile {
  int64_t g = 0;
  int64_t first = 0;
  int64_t count = 0;
};

// Steps 1 and 2 for one tile: each row's weights over its keys into its row of `weights`
// (keys floats apart), the batch's first query j0.
void WeighTile(const AttentionMassParams& p, const Tile& tile, int64_t j0, float scale,
               int64_t keys, float* weights) {
  const int64_t group = p.num_heads / p.num_kv_heads;
  const int64_t dim = p.head_dim;
  const float* q[kMaxTileRows];
  float* w[kMaxTileRows];
  int64_t n[kMaxTileRows];
  int64_t last = 0;
  for (int64_t r = 0; r < tile.count; ++r) {
    const int64_t row = tile.first + r;
    const int64_t j = j0 + row / group, h = tile.g * group + row % group;
    q[r] = p.q + j * p.q_token_stride + h * dim;
    w[r] = weights + ((j - j0) * p.num_heads + h) * keys;
    n[r] = p.start_pos + j + 1;
    last = std::max(last, n[r]);
  }
#if PD_CPU_X86
  // With AVX-512, rows r and r + 1 (r even) scored together, packed [dim / 8][16].
  const bool pairs = dim % 8 == 0 && ActiveIsa() == Isa::kAvx512;
  thread_local std::vector<float> packed;
  if (pairs) {
    packed.resize(static_cast<size_t>(tile.count * dim));
    for (int64_t r = 0; r + 1 < tile.count; r += 2) {
      float* out = &packed[static_cast<size_t>(r * dim)];
      for (int64_t d = 0; d < dim; d += 8) {
        std::memcpy(out + 2 * d, q[r] + d, 8 * sizeof(float));
        std::memcpy(out + 2 * d + 8, q[r + 1] + d, 8 * sizeof(float));
      }
    }
  }
#endif
  // Keys in chunks: the caller's rows, the f32 cache's rows in place, or widened here.
  thread_local std::vector<float> buf;
  buf.resize(static_cast<size_t>(kKeyChunk * dim));
  const KvCacheView* c = p.cache;
  const bool in_place = p.k == nullptr && !p.latent && c->dtype == DType::kF32;
  for (int64_t t0 = 0; t0 < last;) {
    int64_t count = std::min(kKeyChunk, last - t0);
    const float* chunk = nullptr;
    int64_t stride = dim;
    if (p.k != nullptr) {
      chunk = p.k + t0 * p.k_token_stride + tile.g * dim;
      stride = p.k_token_stride;
    } else {
      count = std::min(count, c->block_size - t0 % c->block_size);
      if (in_place) {
        chunk = reinterpret_cast<const float*>(
            static_cast<const char*>(c->base) +
            KvRowByteOffset(*c, p.block_table[t0 / c->block_size], c->layer, false, tile.g,
                            t0 % c->block_size));
        stride = KvRowPitch(c->dtype, c->head_dim);
      } else {
        for (int64_t i = 0; i < count; ++i) {
          ReadKey(p, tile.g, t0 + i, &buf[static_cast<size_t>(i * dim)]);
        }
        chunk = buf.data();
      }
    }
    for (int64_t r = 0; r < tile.count;) {
      const int64_t valid = std::min(count, n[r] - t0);
#if PD_CPU_X86
      if (pairs && r % 2 == 0 && r + 1 < tile.count && valid == std::min(count, n[r + 1] - t0) &&
          valid > 0) {
        ScorePairAvx512(&packed[static_cast<size_t>(r * dim)], q[r], q[r + 1], chunk, stride, valid,
                        dim, scale, w[r] + t0, w[r + 1] + t0);
        r += 2;
        continue;
      }
#endif
      if (valid > 0) ScoreKeys(q[r], chunk, stride, valid, dim, scale, w[r] + t0);
      ++r;
    }
    t0 += count;
  }
  for (int64_t r = 0; r < tile.count; ++r) {
    float* s = w[r];
    float max = -INFINITY;
    // The reference's std::fmax, inline: NaN scores are passed over by both, and a max of +0
    // or -0 gives the same s - max (so the same exp) for every score.
    for (int64_t t = 0; t < n[r]; ++t) max = s[t] > max ? s[t] : max;
    float sum = 0.0f;
    for (int64_t t = 0; t < n[r]; ++t) {
      s[t] = std::exp(s[t] - max);
      sum += s[t];
    }
    for (int64_t t = 0; t < n[r]; ++t) s[t] = s[t] / sum;
  }
}

// Step 3 for kv head g: its rows' weights added to its mass row in the rule's order.
void AddHead(const AttentionMassParams& p, int64_t g, int64_t j0, int64_t jn, int64_t keys,
             const float* weights) {
  const int64_t group = p.num_heads / p.num_kv_heads;
  float* mass = p.mass + g * p.mass_head_stride;
  for (int64_t j = j0; j < j0 + jn; ++j) {
    const int64_t n = p.start_pos + j + 1;
    for (int64_t h = g * group; h < (g + 1) * group; ++h) {
      const float* w = weights + ((j - j0) * p.num_heads + h) * keys;
      for (int64_t t = 0; t < n; ++t) mass[t] += w[t];
    }
  }
}

}  // namespace

void AttentionMass(const OpContext& ctx, const AttentionMassParams& p) {
  const int64_t group = p.num_heads / p.num_kv_heads;
  const int64_t keys = p.start_pos + p.num_tokens;
  const float scale = p.scale != 0.0f ? p.scale : 1.0f / std::sqrt(static_cast<float>(p.head_dim));
  const int threads = NumThreads(ctx);
  // Queries in batches whose weights fit kMaxWeights floats.
  constexpr int64_t kMaxWeights = int64_t{1} << 22;
  const int64_t batch = std::max<int64_t>(1, kMaxWeights / (p.num_heads * keys));
  // The calling thread's buffers, kept between calls: a decode step's weights (heads x context
  // floats) would otherwise be a fresh mapping, faulted in page by page, every layer.
  thread_local std::vector<float> weights;
  thread_local std::vector<Tile> tiles;
  for (int64_t j0 = 0; j0 < p.num_tokens; j0 += batch) {
    const int64_t jn = std::min(batch, p.num_tokens - j0);
    weights.resize(static_cast<size_t>(jn * p.num_heads * keys));
    // Each kv head's rows in tiles: at most kMaxTileRows, and enough tiles to keep every
    // thread busy when there are fewer kv heads than threads (MLA's one latent row).
    const int64_t rows = jn * group;
    const int64_t splits =
        std::max<int64_t>((rows + kMaxTileRows - 1) / kMaxTileRows,
                          std::min<int64_t>(rows, (threads + p.num_kv_heads - 1) / p.num_kv_heads));
    const int64_t tile_rows = (rows + splits - 1) / splits;
    tiles.clear();
    for (int64_t g = 0; g < p.num_kv_heads; ++g) {
      for (int64_t first = 0; first < rows; first += tile_rows) {
        tiles.push_back({g, first, std::min(tile_rows, rows - first)});
      }
    }
    // One tile per kv head: its task adds the head's row itself, one fork-join in all. (The
    // tasks run on other threads, whose thread_locals are their own: they get pointers.)
    const bool whole_heads = tile_rows == rows;
    float* const w = weights.data();
    const Tile* const tile_list = tiles.data();
    ParallelStrided(ctx, static_cast<int64_t>(tiles.size()), threads, [&](int, int64_t i) {
      const Tile& tile = tile_list[i];
      WeighTile(p, tile, j0, scale, keys, w);
      if (whole_heads) AddHead(p, tile.g, j0, jn, keys, w);
    });
    if (!whole_heads) {
      ParallelStrided(ctx, p.num_kv_heads, threads,
                      [&](int, int64_t g) { AddHead(p, g, j0, jn, keys, w); });
    }
  }
}

}  // namespace pd::kernels::cpu
