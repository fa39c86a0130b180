// The tensor-core prefill (kernels/cuda/prefill_tc.{h,cu}) emulated on the host: the kernel's
// grid, key tiles, loads, bf16 roundings and per-row softmax steps through the same functions,
// with the WMMA products as plain loops (f32 sums of exact bf16 x bf16 products), compared with
// the reference op on a bf16 cache.
#include "kernels/cuda/prefill_tc.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/half.h"
#include "kernels/reference/reference_ops.h"

namespace pd::kernels::cuda {
namespace {

float RoundBf16(float x) { return Bf16ToF32(F32ToBf16(x)); }

struct Case {
  int64_t num_kv_heads, num_heads, head_dim, block_size, start_pos, num_tokens;
};

struct Pool {
  std::vector<uint16_t> data;  // bf16 bits
  KvCacheView view;
  std::vector<int32_t> table;
};

// A bf16 pool (2 layers, layer 1 used) holding random K/V for positions [0, len) through a
// shuffled block table.
Pool MakePool(const Case& c, std::mt19937& rng) {
  const int64_t len = c.start_pos + c.num_tokens;
  const int64_t blocks = (len + c.block_size - 1) / c.block_size + 3;
  Pool p;
  p.view = DenseKvCacheView(nullptr, DType::kBF16, blocks, 2, c.num_kv_heads, c.block_size,
                            c.head_dim, /*layer=*/1);
  p.data.assign(blocks * p.view.block_stride, 0x7fc0);  // NaN: unwritten slots show up
  p.view.base = p.data.data();
  p.table.resize(blocks);
  std::iota(p.table.begin(), p.table.end(), 0);
  std::shuffle(p.table.begin(), p.table.end(), rng);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  for (int64_t t = 0; t < len; ++t) {
    const int64_t b = p.table[t / c.block_size];
    for (int64_t h = 0; h < c.num_kv_heads; ++h) {
      for (bool value : {false, true}) {
        const int64_t off = KvElementOffset(p.view, b, h, t, value);
        for (int64_t e = 0; e < c.head_dim; ++e) {
          p.data[off + e] = F32ToBf16(dist(rng));
        }
      }
    }
  }
  return p;
}

// The kernel, block by block, step by step.
void EmulatePrefillTc(const PrefillAttentionParams& p) {
  const KvCacheView& c = p.cache;
  const int64_t d = c.head_dim;
  const float scale = p.scale != 0.0f ? p.scale : 1.0f / std::sqrt(static_cast<float>(d));
  const LaunchShape shape = PrefillTcLaunch(p.num_tokens, p.num_heads, d);
  const int64_t num_keys = p.start_pos + p.num_tokens;
  const uint16_t* base = static_cast<const uint16_t*>(c.base);
  for (int64_t blk = 0; blk < shape.grid; ++blk) {
    const RowHead rh = RowHeadAt(blk, p.num_heads);
    const int64_t q0 = rh.row * kPrefillTcQueries;
    const int64_t kv_head = KvHeadOf(rh.head, p.num_heads, c.num_kv_heads);
    std::vector<float> q(kPrefillTcQueries * d), kt(kPrefillTcKeys * d), vt(kPrefillTcKeys * d);
    std::vector<float> o(kPrefillTcQueries * d, 0.0f), s(kPrefillTcKeys);
    std::vector<float> m(kPrefillTcQueries, -INFINITY), l(kPrefillTcQueries, 0.0f);
    for (int64_t r = 0; r < kPrefillTcQueries; ++r) {
      for (int64_t e = 0; e < d; ++e) {
        const int64_t row = q0 + r;
        q[r * d + e] =
            row < p.num_tokens ? RoundBf16(p.q[row * p.q_token_stride + rh.head * d + e]) : 0.0f;
      }
    }
    const int64_t tiles = PrefillTcKeyTiles(p.start_pos, rh.row, p.num_tokens);
    for (int64_t t = 0; t < tiles; ++t) {
      const int64_t first = t * kPrefillTcKeys;
      for (int64_t k = 0; k < kPrefillTcKeys; ++k) {
        const int64_t key = first + k;
        for (int64_t e = 0; e < d; ++e) {
          kt[k * d + e] = vt[k * d + e] = 0.0f;
          if (key < num_keys) {
            const int64_t b = p.block_table[key / c.block_size];
            kt[k * d + e] = Bf16ToF32(base[KvElementOffset(c, b, kv_head, key, false) + e]);
            vt[k * d + e] = Bf16ToF32(base[KvElementOffset(c, b, kv_head, key, true) + e]);
          }
        }
      }
      for (int64_t r = 0; r < kPrefillTcQueries; ++r) {
        for (int64_t k = 0; k < kPrefillTcKeys; ++k) {
          float dot = 0.0f;
          for (int64_t e = 0; e < d; ++e) {
            dot += q[r * d + e] * kt[k * d + e];
          }
          s[k] = dot;
        }
        const int64_t row = q0 + r;
        const int visible = row < p.num_tokens ? PrefillTcVisible(p.start_pos, row, first) : 0;
        const float corr = TileSoftmaxRow(s.data(), kPrefillTcKeys, visible, scale, &m[r], &l[r]);
        for (int64_t e = 0; e < d; ++e) {
          float acc = o[r * d + e] * corr;
          for (int64_t k = 0; k < kPrefillTcKeys; ++k) {
            acc += RoundBf16(s[k]) * vt[k * d + e];
          }
          o[r * d + e] = acc;
        }
      }
    }
    for (int64_t r = 0; r < kPrefillTcQueries; ++r) {
      const int64_t row = q0 + r;
      if (row < p.num_tokens) {
        for (int64_t e = 0; e < d; ++e) {
          p.out[row * p.out_token_stride + rh.head * d + e] = o[r * d + e] / l[r];
        }
      }
    }
  }
}

TEST(PrefillTcTest, LayoutTilesAndVisibility) {
  const PrefillTcSmem l64 = PrefillTcLayout(64), l128 = PrefillTcLayout(128);
  for (const PrefillTcSmem& l : {l64, l128}) {
    for (int64_t off : {l.q, l.kv, l.s, l.p, l.o, l.m, l.l, l.total}) {
      EXPECT_EQ(off % 128, 0);
    }
    EXPECT_LT(l.q, l.kv);
    EXPECT_LT(l.o, l.m);
  }
  EXPECT_GE(l128.kv - l128.q, kPrefillTcQueries * 128 * 2);
  EXPECT_GE(l128.m - l128.o, kPrefillTcQueries * 128 * 4);
  EXPECT_LE(l128.total, 100 * 1024);  // opt-in dynamic shared memory: sm_80 allows 163 KiB
  EXPECT_EQ(PrefillTcLaunch(65, 8, 64).grid, 16);
  EXPECT_EQ(PrefillTcLaunch(64, 8, 64).grid, 8);
  EXPECT_EQ(PrefillTcLaunch(1, 8, 64).threads, kPrefillTcThreads);
  // Causal tiles: tile 0 of 64 rows from position 0 sees keys [0, 64): one tile.
  EXPECT_EQ(PrefillTcKeyTiles(0, 0, 200), 1);
  EXPECT_EQ(PrefillTcKeyTiles(0, 1, 200), 2);
  EXPECT_EQ(PrefillTcKeyTiles(0, 3, 200), 4);  // rows 192-199: keys [0, 200)
  EXPECT_EQ(PrefillTcKeyTiles(1, 0, 200), 2);  // row 63 sees key 64
  EXPECT_EQ(PrefillTcKeyTiles(100, 0, 5), 2);  // rows 0-4 at positions 100-104
  EXPECT_EQ(PrefillTcVisible(0, 0, 0), 1);
  EXPECT_EQ(PrefillTcVisible(0, 63, 0), 64);
  EXPECT_EQ(PrefillTcVisible(0, 63, 64), 0);
  EXPECT_EQ(PrefillTcVisible(10, 0, 0), 11);
  EXPECT_EQ(PrefillTcVisible(200, 5, 64), 64);
}

TEST(PrefillTcTest, SoftmaxStepsFoldLikeOneSoftmax) {
  // Two tiles folded one after the other equal one softmax over both.
  std::vector<float> a = {1.0f, 3.0f, -2.0f, 0.5f}, b = {4.0f, 0.0f, 9.0f, 9.0f};
  float m = -INFINITY, l = 0.0f;
  EXPECT_EQ(TileSoftmaxRow(a.data(), 4, 4, 0.5f, &m, &l), 0.0f);    // first tile: O was empty
  const float corr = TileSoftmaxRow(b.data(), 4, 2, 0.5f, &m, &l);  // keys 2, 3 invisible
  EXPECT_FLOAT_EQ(m, 2.0f);
  EXPECT_FLOAT_EQ(corr, std::exp(1.5f - 2.0f));
  EXPECT_EQ(b[2], 0.0f);
  EXPECT_EQ(b[3], 0.0f);
  double want = 0.0;
  for (float x : {1.0f, 3.0f, -2.0f, 0.5f, 4.0f, 0.0f}) {
    want += std::exp(0.5 * x - 2.0);
  }
  EXPECT_NEAR(l, want, 1e-5);
  // A tile with nothing visible changes nothing.
  std::vector<float> c = {5.0f, 5.0f};
  EXPECT_EQ(TileSoftmaxRow(c.data(), 2, 0, 0.5f, &m, &l), 1.0f);
  EXPECT_EQ(c[0], 0.0f);
  EXPECT_FLOAT_EQ(m, 2.0f);
}

TEST(PrefillTcTest, EligibleOnlyForAlignedBf16WithTensorCoresAsked) {
  alignas(16) static uint16_t buf[64];
  PrefillAttentionParams p;
  p.cache = DenseKvCacheView(buf, DType::kBF16, 4, 2, 2, 16, 64, 0);
  p.tensor_cores = true;
  EXPECT_TRUE(PrefillTcEligible(p));
  p.tensor_cores = false;
  EXPECT_FALSE(PrefillTcEligible(p));
  p.tensor_cores = true;
  p.cache = DenseKvCacheView(buf, DType::kF32, 4, 2, 2, 16, 64, 0);
  EXPECT_FALSE(PrefillTcEligible(p));
  p.cache = DenseKvCacheView(buf, DType::kBF16, 4, 2, 2, 16, 8, 0);  // stories260K's head_dim
  EXPECT_FALSE(PrefillTcEligible(p));
  p.cache = DenseKvCacheView(buf, DType::kBF16, 4, 2, 2, 16, 256, 0);
  EXPECT_FALSE(PrefillTcEligible(p));
  p.cache = DenseKvCacheView(buf + 1, DType::kBF16, 4, 2, 2, 16, 64, 0);  // misaligned base
  EXPECT_FALSE(PrefillTcEligible(p));
}

TEST(PrefillTcTest, EmulationMatchesReferenceWithinBf16Rounding) {
  std::mt19937 rng(31);
  const std::vector<Case> cases = {
      {2, 8, 64, 16, 0, 37},    // one query tile, GQA 4:1
      {2, 8, 64, 16, 13, 150},  // three query tiles, a prefix, tails
      {1, 4, 128, 32, 64, 64},  // head_dim 128, a prefix of exactly one key tile
      {4, 4, 16, 16, 200, 3},   // few rows far into the sequence (prefix-cache hit)
      {1, 2, 32, 16, 0, 1},     // one token
  };
  for (const Case& k : cases) {
    Pool pool = MakePool(k, rng);
    const int64_t row = k.num_heads * k.head_dim;
    std::vector<float> q(k.num_tokens * row);
    std::normal_distribution<float> dist(0.0f, 1.0f);
    for (float& x : q) {
      x = dist(rng);
    }
    PrefillAttentionParams p;
    p.q = q.data();
    p.q_token_stride = row;
    p.out_token_stride = row + 2;
    p.cache = pool.view;
    p.block_table = pool.table.data();
    p.num_table_blocks = static_cast<int64_t>(pool.table.size());
    p.start_pos = k.start_pos;
    p.num_tokens = k.num_tokens;
    p.num_heads = k.num_heads;
    std::vector<float> want(k.num_tokens * (row + 2), -3.0f), got = want;
    p.out = want.data();
    reference::PrefillAttention(p);
    p.out = got.data();
    EmulatePrefillTc(p);
    double max_err = 0.0, max_ref = 0.0;
    for (size_t i = 0; i < got.size(); ++i) {
      ASSERT_FALSE(std::isnan(got[i])) << i;
      max_err = std::max(max_err, static_cast<double>(std::fabs(got[i] - want[i])));
      max_ref = std::max(max_ref, static_cast<double>(std::fabs(want[i])));
    }
    // Q and P rounded to bf16 (8 bits of mantissa): errors of a few 1e-3 on outputs of O(1).
    EXPECT_LT(max_err, 2e-2) << "head_dim " << k.head_dim << " start " << k.start_pos << " tokens "
                             << k.num_tokens;
    EXPECT_GT(max_ref, 0.1);
    EXPECT_EQ(got[row], -3.0f);  // the padding of out is left alone
  }
}

}  // namespace
}  // namespace pd::kernels::cuda
