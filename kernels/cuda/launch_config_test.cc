// CPU-side tests of the CUDA kernels' launch-shape and index logic (label unit: no GPU needed).
// Besides checking the shapes, each test emulates its kernel's thread decomposition on the host
// through the same launch_config.h functions (every (block, thread) of the grid, the block
// table and pool offsets, the tails) and compares the result with kernels/reference, so a wrong
// index in the shared functions fails here, not only on a GPU.
#include "kernels/cuda/launch_config.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cuda/sampling_radix.h"
#include "kernels/reference/reference_ops.h"

namespace pd::kernels::cuda {
namespace {

std::vector<float> Random(int64_t n, std::mt19937& rng) {
  std::normal_distribution<float> dist;
  std::vector<float> v(n);
  for (float& x : v) {
    x = dist(rng);
  }
  return v;
}

// Calls fn(i) for every item a grid-stride loop over `shape` visits, in the kernels' pattern.
template <typename Fn>
void ForEachGridStrideItem(const LaunchShape& shape, int64_t n, Fn&& fn) {
  const int64_t stride = shape.grid * shape.threads;
  for (int64_t block = 0; block < shape.grid; ++block) {
    for (int64_t thread = 0; thread < shape.threads; ++thread) {
      for (int64_t i = block * shape.threads + thread; i < n; i += stride) {
        fn(i);
      }
    }
  }
}

TEST(CudaLaunchTest, ThreadsPerBlockRoundToWarps) {
  EXPECT_EQ(RmsNormThreadsPerBlock(1), 32);
  EXPECT_EQ(RmsNormThreadsPerBlock(64), 64);
  EXPECT_EQ(RmsNormThreadsPerBlock(65), 96);
  EXPECT_EQ(RmsNormThreadsPerBlock(4096), 1024);
  EXPECT_EQ(WarpRoundedThreads(0, 256), 32);
  EXPECT_EQ(WarpRoundedThreads(257, 256), 256);
  EXPECT_EQ(CeilDiv(0, 7), 0);
  EXPECT_EQ(CeilDiv(7, 7), 1);
  EXPECT_EQ(CeilDiv(8, 7), 2);
}

TEST(CudaLaunchTest, ElementwiseGridCoversEveryItemOnce) {
  EXPECT_EQ(ElementwiseLaunch(1).grid, 1);
  EXPECT_EQ(ElementwiseLaunch(256).grid, 1);
  EXPECT_EQ(ElementwiseLaunch(257).grid, 2);
  EXPECT_EQ(ElementwiseLaunch(int64_t{1} << 40).grid, kMaxElementwiseBlocks);
  EXPECT_EQ(ElementwiseLaunch(5).threads, kElementwiseThreads);
  // Tails: one item, a partial last block, and more items than the capped grid covers at once.
  for (int64_t n : {int64_t{1}, int64_t{255}, int64_t{257}, int64_t{1000},
                    kMaxElementwiseBlocks * kElementwiseThreads + 77}) {
    std::vector<uint8_t> hits(n, 0);
    ForEachGridStrideItem(ElementwiseLaunch(n), n, [&](int64_t i) { ++hits[i]; });
    EXPECT_TRUE(std::all_of(hits.begin(), hits.end(), [](uint8_t h) { return h == 1; })) << n;
  }
  const RowCol rc = RowColAt(23, 10);
  EXPECT_EQ(rc.row, 2);
  EXPECT_EQ(rc.col, 3);
}

// Convert through the kernel's items: elements when converting, 16-bit words when copying.
TEST(CudaLaunchTest, ConvertEmulationMatchesReference) {
  std::mt19937 rng(10);
  const int64_t n = 1001;
  std::vector<float> f = Random(n, rng);
  f[3] = std::numeric_limits<float>::quiet_NaN();
  f[4] = std::numeric_limits<float>::infinity();
  f[5] = 1e-40f;  // f32 subnormal
  std::vector<uint16_t> bf(n);
  ConvertParams p{f.data(), bf.data(), n, DType::kF32, DType::kBF16};
  EXPECT_EQ(ConvertItems(p), n);
  reference::Convert(p);
  std::vector<uint16_t> got(n, 0);
  ForEachGridStrideItem(ElementwiseLaunch(ConvertItems(p)), ConvertItems(p),
                        [&](int64_t i) { got[i] = F32ToBf16(f[i]); });
  EXPECT_EQ(got, bf);
  // An f32 -> f32 copy moves 2n 16-bit words.
  std::vector<float> copy(n, 0.0f);
  const ConvertParams same{f.data(), copy.data(), n, DType::kF32, DType::kF32};
  ASSERT_EQ(ConvertItems(same), 2 * n);
  const auto* in16 = reinterpret_cast<const uint16_t*>(f.data());
  auto* out16 = reinterpret_cast<uint16_t*>(copy.data());
  ForEachGridStrideItem(ElementwiseLaunch(ConvertItems(same)), ConvertItems(same),
                        [&](int64_t i) { out16[i] = in16[i]; });
  EXPECT_EQ(std::memcmp(copy.data(), f.data(), n * sizeof(float)), 0);
  EXPECT_EQ(ConvertItems(ConvertParams{bf.data(), bf.data(), n, DType::kBF16, DType::kBF16}), n);
}

// RMSNorm through the kernel's shape: one block per row of RmsNormThreadsPerBlock threads, each
// thread summing the elements threadIdx, threadIdx + blockDim, ..., then one sum per warp.
TEST(CudaLaunchTest, RmsNormEmulationMatchesReference) {
  std::mt19937 rng(12);
  for (int64_t dim : {1, 33, 1024, 5000}) {
    const int64_t rows = 3, stride = dim + 1;
    const std::vector<float> in = Random(rows * stride, rng), w = Random(dim, rng);
    std::vector<float> got(rows * dim), want(rows * dim);
    reference::RmsNorm(
        RmsNormParams{in.data(), w.data(), want.data(), rows, dim, stride, dim, 1e-5f});
    const int threads = RmsNormThreadsPerBlock(dim);
    ASSERT_LE(threads / kWarpSize, kMaxThreadsPerBlock / kWarpSize);  // warp_sums capacity
    for (int64_t r = 0; r < rows; ++r) {
      std::vector<float> warp_sums(threads / kWarpSize, 0.0f);
      std::vector<int> hits(dim, 0);
      for (int t = 0; t < threads; ++t) {
        for (int64_t i = t; i < dim; i += threads) {
          const float x = in[r * stride + i];
          warp_sums[t / kWarpSize] += x * x;
          ++hits[i];
        }
      }
      ASSERT_TRUE(std::all_of(hits.begin(), hits.end(), [](int h) { return h == 1; }));
      const float total = std::accumulate(warp_sums.begin(), warp_sums.end(), 0.0f);
      const float inv_rms = 1.0f / std::sqrt(total / static_cast<float>(dim) + 1e-5f);
      for (int64_t i = 0; i < dim; ++i) {
        got[r * dim + i] = w[i] * (in[r * stride + i] * inv_rms);
      }
    }
    for (size_t i = 0; i < got.size(); ++i) {
      ASSERT_NEAR(got[i], want[i], 1e-4f) << dim << " " << i;
    }
  }
}

// SiluMul through the kernel's flat-index decomposition, with strided rows.
TEST(CudaLaunchTest, SiluMulEmulationMatchesReference) {
  std::mt19937 rng(1);
  const int64_t rows = 5, dim = 37, gs = 80, us = 40, os = 41;
  std::vector<float> fused = Random(rows * gs, rng), up = Random(rows * us, rng);
  std::vector<float> got(rows * os, -1.0f), want(rows * os, -1.0f);
  SiluMulParams p{fused.data(), up.data(), want.data(), rows, dim, gs, us, os};
  reference::SiluMul(p);
  ForEachGridStrideItem(ElementwiseLaunch(rows * dim), rows * dim, [&](int64_t i) {
    const RowCol rc = RowColAt(i, dim);
    const float g = fused[rc.row * gs + rc.col], u = up[rc.row * us + rc.col];
    got[rc.row * os + rc.col] = g / (1.0f + std::exp(-g)) * u;
  });
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_NEAR(got[i], want[i], 1e-5f) << i;  // -1 padding stays untouched in both
  }
}

TEST(CudaLaunchTest, RopeItemsTouchEveryElementOnceAndMatchReference) {
  std::mt19937 rng(2);
  for (RopeStyle style : {RopeStyle::kInterleaved, RopeStyle::kRotateHalf}) {
    RopeParams p;
    p.num_tokens = 3;
    p.num_heads = 4;
    p.num_kv_heads = 2;
    p.head_dim = 8;
    p.q_token_stride = 36;  // padded rows
    p.k_token_stride = 17;
    p.style = style;
    std::vector<float> q = Random(p.num_tokens * p.q_token_stride, rng);
    std::vector<float> k = Random(p.num_tokens * p.k_token_stride, rng);
    std::vector<float> q_want = q, k_want = k;
    std::vector<int32_t> pos = {0, 7, 1000};
    std::vector<float> inv_freq = {1.0f, 0.1f, 0.01f, 0.001f};
    p.positions = pos.data();
    p.inv_freq = inv_freq.data();
    RopeParams ref = p;
    ref.q = q_want.data();
    ref.k = k_want.data();
    reference::Rope(ref);

    std::vector<int> q_hits(q.size(), 0), k_hits(k.size(), 0);
    const int64_t n = RopeNumItems(p);
    EXPECT_EQ(n, 3 * 6 * 4);
    ForEachGridStrideItem(ElementwiseLaunch(n), n, [&](int64_t i) {
      const RopeItem it = RopeItemAt(i, p.num_heads, p.num_kv_heads, p.head_dim);
      float* x = (it.is_k ? k.data() : q.data()) + RopeHeadOffset(p, it);
      std::vector<int>& hits = it.is_k ? k_hits : q_hits;
      const RopePair pr = RopePairAt(style, p.head_dim, it.pair);
      ++hits[x - (it.is_k ? k.data() : q.data()) + pr.a];
      ++hits[x - (it.is_k ? k.data() : q.data()) + pr.b];
      const double angle = static_cast<double>(pos[it.token]) * inv_freq[it.pair];
      const float c = static_cast<float>(std::cos(angle)), s = static_cast<float>(std::sin(angle));
      const float a = x[pr.a], b = x[pr.b];
      x[pr.a] = a * c - b * s;
      x[pr.b] = a * s + b * c;
    });
    for (int64_t t = 0; t < p.num_tokens; ++t) {
      for (int64_t e = 0; e < p.q_token_stride; ++e) {
        EXPECT_EQ(q_hits[t * p.q_token_stride + e], e < p.num_heads * p.head_dim ? 1 : 0);
      }
      for (int64_t e = 0; e < p.k_token_stride; ++e) {
        EXPECT_EQ(k_hits[t * p.k_token_stride + e], e < p.num_kv_heads * p.head_dim ? 1 : 0);
      }
    }
    for (size_t i = 0; i < q.size(); ++i) {
      ASSERT_NEAR(q[i], q_want[i], 1e-5f) << i;
    }
    for (size_t i = 0; i < k.size(); ++i) {
      ASSERT_NEAR(k[i], k_want[i], 1e-5f) << i;
    }
  }
}

TEST(CudaLaunchTest, AttentionShapes) {
  const LaunchShape s = AttentionLaunch(/*rows=*/5, /*num_heads=*/8, /*head_dim=*/128);
  EXPECT_EQ(s.grid, 40);
  EXPECT_EQ(s.threads, kAttentionThreads);
  EXPECT_EQ(s.threads % kWarpSize, 0);
  EXPECT_EQ(s.shared_bytes, (kAttentionWarps * 128 + 2 * kAttentionWarps) * 4);
  EXPECT_LE(AttentionSharedBytes(kMaxAttentionHeadDim), 48 * 1024);
  EXPECT_EQ(kMaxDimsPerLane * kWarpSize, kMaxAttentionHeadDim);
  const RowHead rh = RowHeadAt(19, 8);
  EXPECT_EQ(rh.row, 2);
  EXPECT_EQ(rh.head, 3);
  // GQA: 8 query heads over 2 kv heads.
  EXPECT_EQ(KvHeadOf(0, 8, 2), 0);
  EXPECT_EQ(KvHeadOf(3, 8, 2), 0);
  EXPECT_EQ(KvHeadOf(4, 8, 2), 1);
  EXPECT_EQ(KvHeadOf(7, 8, 8), 7);
  EXPECT_EQ(PrefillNumKeys(0, 0), 1);
  EXPECT_EQ(PrefillNumKeys(16, 3), 20);
  EXPECT_EQ(BlockTableIndex(2, 10, 33, 16), 22);
  EXPECT_FLOAT_EQ(AttentionScale(0.0f, 64), 0.125f);
  EXPECT_FLOAT_EQ(AttentionScale(0.5f, 64), 0.5f);
  const LaunchShape w = WriteKvLaunch(7, 2, 8);
  EXPECT_EQ(w.grid, 7);
  EXPECT_EQ(w.threads, 32);
  EXPECT_EQ(WriteKvLaunch(1, 8, 128).threads, 256);
}

// A pool and block tables for the emulations: 2 layers (view of layer 1), GQA 8/2, scattered
// block ids, block size 4 so short sequences cross block boundaries.
struct Pool {
  static constexpr int64_t kBlocks = 12, kLayers = 2, kKvHeads = 2, kBlockSize = 4, kHeadDim = 8;
  std::vector<uint16_t> data;
  KvCacheView view;
  explicit Pool(std::mt19937& rng)
      : data(kBlocks * kLayers * 2 * kKvHeads * kBlockSize * kHeadDim) {
    for (uint16_t& x : data) {
      x = F32ToBf16(std::normal_distribution<float>()(rng));
    }
    view = DenseKvCacheView(data.data(), DType::kBF16, kBlocks, kLayers, kKvHeads, kBlockSize,
                            kHeadDim, /*layer=*/1);
  }
};

// The kernel's AttendRow run on the host: the same split of keys over warps and of head dims
// over lanes, the same offsets, and the same f32 online softmax and warp merge
// (OnlineSoftmaxUpdate, WarpMergeFactor). Only the order of the 32-lane dot-product sum
// differs from the shuffle tree.
void EmulateAttendRow(const KvCacheView& c, const int32_t* table, int64_t kv_head, const float* q,
                      int64_t num_keys, float scale, float* out) {
  auto load = [&](int64_t off) { return Bf16ToF32(static_cast<const uint16_t*>(c.base)[off]); };
  std::vector<int> seen(num_keys, 0);
  SoftmaxState state[kAttentionWarps];
  std::vector<float> acc(kAttentionWarps * c.head_dim, 0.0f);  // [warp][d]: lanes' registers
  for (int warp = 0; warp < kAttentionWarps; ++warp) {
    for (int64_t t = warp; t < num_keys; t += kAttentionWarps) {
      ++seen[t];
      const int64_t k_off = KvElementOffset(c, table[t / c.block_size], kv_head, t, false);
      float dot = 0.0f;
      for (int lane = 0; lane < kWarpSize; ++lane) {
        float partial = 0.0f;
        for (int j = 0; j < kMaxDimsPerLane; ++j) {
          const int64_t d = lane + j * kWarpSize;
          if (d < c.head_dim) {
            partial += q[d] * scale * load(k_off + d);
          }
        }
        dot += partial;
      }
      const SoftmaxStep step = OnlineSoftmaxUpdate(&state[warp], dot);
      const int64_t v_off = k_off + c.kv_stride;
      for (int64_t d = 0; d < c.head_dim; ++d) {
        float& a = acc[warp * c.head_dim + d];
        a = a * step.correction + step.weight * load(v_off + d);
      }
    }
  }
  for (int s : seen) {
    ASSERT_EQ(s, 1);
  }
  float global_max = -INFINITY;
  for (const SoftmaxState& st : state) {
    global_max = std::max(global_max, st.max);
  }
  float total = 0.0f, factor[kAttentionWarps];
  for (int w = 0; w < kAttentionWarps; ++w) {
    factor[w] = WarpMergeFactor(state[w], global_max);
    total += state[w].sum * factor[w];
  }
  for (int64_t d = 0; d < c.head_dim; ++d) {
    float o = 0.0f;
    for (int w = 0; w < kAttentionWarps; ++w) {
      o += acc[w * c.head_dim + d] * factor[w];
    }
    out[d] = o / total;
  }
}

TEST(CudaLaunchTest, OnlineSoftmaxSteps) {
  SoftmaxState st;
  SoftmaxStep step = OnlineSoftmaxUpdate(&st, 2.0f);  // first key
  EXPECT_EQ(step.correction, 0.0f);
  EXPECT_EQ(step.weight, 1.0f);
  EXPECT_EQ(st.max, 2.0f);
  EXPECT_EQ(st.sum, 1.0f);
  step = OnlineSoftmaxUpdate(&st, 1.0f);  // smaller: no rescale
  EXPECT_EQ(step.correction, 1.0f);
  EXPECT_FLOAT_EQ(step.weight, std::exp(-1.0f));
  step = OnlineSoftmaxUpdate(&st, 4.0f);  // larger: everything so far rescales
  EXPECT_FLOAT_EQ(step.correction, std::exp(-2.0f));
  EXPECT_EQ(step.weight, 1.0f);
  EXPECT_FLOAT_EQ(st.sum, (1.0f + std::exp(-1.0f)) * std::exp(-2.0f) + 1.0f);
  EXPECT_EQ(WarpMergeFactor(SoftmaxState{}, 3.0f), 0.0f);  // a warp without keys
  EXPECT_EQ(WarpMergeFactor(st, 4.0f), 1.0f);
}

TEST(CudaLaunchTest, PrefillAttentionEmulationMatchesReference) {
  std::mt19937 rng(3);
  Pool pool(rng);
  const int64_t num_heads = 8, start_pos = 5, num_tokens = 6;  // positions 5..10: 3 blocks
  const std::vector<int32_t> table = {9, 2, 7};
  const int64_t row = num_heads * Pool::kHeadDim, q_stride = row + 3, out_stride = row + 1;
  std::vector<float> q = Random(num_tokens * q_stride, rng);
  std::vector<float> got(num_tokens * out_stride, 0.0f), want = got;
  PrefillAttentionParams p;
  p.q = q.data();
  p.out = want.data();
  p.q_token_stride = q_stride;
  p.out_token_stride = out_stride;
  p.cache = pool.view;
  p.block_table = table.data();
  p.num_table_blocks = 3;
  p.start_pos = start_pos;
  p.num_tokens = num_tokens;
  p.num_heads = num_heads;
  reference::PrefillAttention(p);
  const LaunchShape s = AttentionLaunch(num_tokens, num_heads, Pool::kHeadDim);
  const float scale = AttentionScale(p.scale, Pool::kHeadDim);
  for (int64_t b = 0; b < s.grid; ++b) {
    const RowHead rh = RowHeadAt(b, num_heads);
    EmulateAttendRow(p.cache, p.block_table, KvHeadOf(rh.head, num_heads, Pool::kKvHeads),
                     q.data() + rh.row * q_stride + rh.head * Pool::kHeadDim,
                     PrefillNumKeys(start_pos, rh.row), scale,
                     got.data() + rh.row * out_stride + rh.head * Pool::kHeadDim);
  }
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_NEAR(got[i], want[i], 1e-5f) << i;
  }
}

// LatentAttentionKernel run on the host: its grid (LatentAttentionLaunch, RowHeadAt), its
// block-table row, its split of keys over warps and of entry elements over lanes
// (LatentEntryElement), the same f32 online softmax and warp merge. Only the order of the
// 32-lane dot-product sum differs from the shuffle tree. The pool's 32-element entry is cut
// into 4 pieces; value_dim 20 ends inside the third.
TEST(CudaLaunchTest, LatentAttentionEmulationMatchesReference) {
  std::mt19937 rng(8);
  Pool pool(rng);
  const KvCacheView& c = pool.view;
  const int64_t entry = LatentEntryDim(c), heads = 3, value_dim = 20, max_blocks = 3;
  ASSERT_EQ(entry, 32);
  const std::vector<int32_t> tables = {9, 2, 7, 4, 11, 0};  // [2][3]
  const std::vector<int32_t> positions = {0, 5, 11, 3, 10, 6};
  const std::vector<int32_t> seqs = {0, 0, 0, 1, 1, 1};
  const auto n = static_cast<int64_t>(positions.size());
  const int64_t q_stride = heads * entry + 3, out_stride = heads * value_dim + 1;
  const std::vector<float> q = Random(n * q_stride, rng);
  std::vector<float> got(n * out_stride, -7.0f), want = got;
  LatentAttentionParams p;
  p.q = q.data();
  p.out = want.data();
  p.q_token_stride = q_stride;
  p.out_token_stride = out_stride;
  p.cache = c;
  p.value_dim = value_dim;
  p.num_heads = heads;
  p.num_tokens = n;
  p.positions = positions.data();
  p.token_seq = seqs.data();
  p.block_tables = tables.data();
  p.num_seqs = 2;
  p.max_blocks_per_seq = max_blocks;
  reference::LatentAttention(p);
  const LaunchShape s = LatentAttentionLaunch(n, heads, value_dim);
  EXPECT_EQ(s.threads, kAttentionThreads);
  EXPECT_EQ(s.shared_bytes, AttentionSharedBytes(value_dim));
  EXPECT_LE(AttentionSharedBytes(kMaxLatentEntryDim), 48 * 1024);  // Launchable at the largest
  const float scale = AttentionScale(p.scale, entry);
  for (int64_t b = 0; b < s.grid; ++b) {
    const RowHead rh = RowHeadAt(b, heads);
    const float* qh = q.data() + rh.row * q_stride + rh.head * entry;
    const int32_t* table =
        tables.data() + BlockTableIndex(seqs[rh.row], max_blocks, 0, c.block_size);
    const int64_t num_keys = positions[rh.row] + 1;
    SoftmaxState state[kAttentionWarps];
    std::vector<float> acc(kAttentionWarps * entry, 0.0f);  // [warp][e]: the lanes' registers
    for (int warp = 0; warp < kAttentionWarps; ++warp) {
      for (int64_t t = warp; t < num_keys; t += kAttentionWarps) {
        const int64_t block_id = table[t / c.block_size];
        std::vector<float> x(entry);
        float dot = 0.0f;
        for (int lane = 0; lane < kWarpSize; ++lane) {
          float partial = 0.0f;
          for (int j = 0; j < kMaxLatentDimsPerLane; ++j) {
            const int64_t e = lane + j * kWarpSize;
            if (e < entry) {
              x[e] = LatentEntryElement(c, block_id, t, e);
              partial += qh[e] * scale * x[e];
            }
          }
          dot += partial;
        }
        const SoftmaxStep step = OnlineSoftmaxUpdate(&state[warp], dot);
        for (int64_t e = 0; e < entry; ++e) {
          float& a = acc[warp * entry + e];
          a = a * step.correction + step.weight * x[e];
        }
      }
    }
    float global_max = -INFINITY, total = 0.0f, factor[kAttentionWarps];
    for (const SoftmaxState& w : state) {
      global_max = std::max(global_max, w.max);
    }
    for (int w = 0; w < kAttentionWarps; ++w) {
      factor[w] = WarpMergeFactor(state[w], global_max);
      total += state[w].sum * factor[w];
    }
    float* out = got.data() + rh.row * out_stride + rh.head * value_dim;
    for (int64_t d = 0; d < value_dim; ++d) {
      float o = 0.0f;
      for (int w = 0; w < kAttentionWarps; ++w) {
        o += acc[w * entry + d] * factor[w];
      }
      out[d] = o / total;
    }
  }
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_NEAR(got[i], want[i], 1e-5f) << i;  // the padding: -7 on both sides
  }
}

TEST(CudaLaunchTest, WriteKvEmulationMatchesReferenceBitwise) {
  std::mt19937 rng(5);
  Pool got_pool(rng);
  std::vector<uint16_t> want_data = got_pool.data;
  KvCacheView want_view = got_pool.view;
  want_view.base = want_data.data();
  const int64_t elems = Pool::kKvHeads * Pool::kHeadDim, k_stride = elems + 2, v_stride = elems;
  // Batched decode: token j of sequence token_seq[j], positions crossing block boundaries.
  const std::vector<int32_t> positions = {0, 3, 4, 8};
  const std::vector<int32_t> token_seq = {1, 0, 1, 0};
  const std::vector<int32_t> tables = {6, 4, 10, 2, 9, 5};  // 2 sequences x 3 blocks
  std::vector<float> k = Random(4 * k_stride, rng), v = Random(4 * v_stride, rng);
  WriteKvParams p;
  p.k = k.data();
  p.v = v.data();
  p.k_token_stride = k_stride;
  p.v_token_stride = v_stride;
  p.cache = want_view;
  p.num_tokens = 4;
  p.positions = positions.data();
  p.token_seq = token_seq.data();
  p.block_tables = tables.data();
  p.num_seqs = 2;
  p.max_blocks_per_seq = 3;
  reference::WriteKv(p);
  const KvCacheView& c = got_pool.view;
  const LaunchShape s = WriteKvLaunch(p.num_tokens, c.num_kv_heads, c.head_dim);
  auto* base = static_cast<uint16_t*>(c.base);
  for (int64_t j = 0; j < s.grid; ++j) {
    const int64_t pos = positions[j];
    const int64_t block = tables[BlockTableIndex(token_seq[j], 3, pos, c.block_size)];
    for (int64_t tid = 0; tid < s.threads; ++tid) {
      for (int64_t e = tid; e < elems; e += s.threads) {
        const int64_t off = KvElementOffset(c, block, e / c.head_dim, pos, false) + e % c.head_dim;
        base[off] = F32ToBf16(k[j * k_stride + e]);
        base[off + c.kv_stride] = F32ToBf16(v[j * v_stride + e]);
      }
    }
  }
  EXPECT_EQ(got_pool.data, want_data);
}

// ReadKv's kernel emulated (ReadKvLaunch's grid and thread loop, ReadKvElement) over a pool the
// reference WriteKv filled, for every cache dtype: bitwise the reference ReadKv, NaN and inf
// rows, all-zero rows and the other layer's rows included. 3 x 96 elements per token exceed
// the 256 threads, so threads loop.
TEST(CudaLaunchTest, ReadKvEmulationMatchesReferenceBitwise) {
  constexpr int64_t kLayers = 2, kHeads = 3, kDim = 96, kBlock = 4, kBlocks = 6, kTokens = 7;
  constexpr int64_t kElems = kHeads * kDim, kStride = kElems + 5;
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<int32_t> tables = {4, 1, 5, 0, 3, 2};  // 2 sequences x 3 blocks
  const std::vector<int32_t> token_seq = {0, 1, 0, 1, 0, 1, 1};
  const std::vector<int32_t> positions = {0, 3, 5, 4, 11, 9, 0};
  for (DType dtype :
       {DType::kF32, DType::kBF16, DType::kF16, DType::kI8, DType::kF8E4M3, DType::kI4}) {
    std::mt19937 rng(21);
    const int64_t bytes = kBlocks * DenseKvBlockBytes(dtype, kLayers, kHeads, kBlock, kDim);
    std::vector<float> storage(static_cast<size_t>(bytes / 4 + 1), 0.0f);
    for (int64_t layer = 0; layer < kLayers; ++layer) {
      std::vector<float> k = Random(kTokens * kStride, rng), v = Random(kTokens * kStride, rng);
      k[1 * kStride + kDim + 7] = std::nanf("");  // token 1, head 1: a NaN row
      v[2 * kStride + 3] = inf;                   // token 2, head 0: an inf row
      std::fill(k.begin() + 3 * kStride, k.begin() + 3 * kStride + kDim, 0.0f);  // a zero row
      WriteKvParams w;
      w.k = k.data();
      w.v = v.data();
      w.k_token_stride = w.v_token_stride = kStride;
      w.cache =
          DenseKvCacheView(storage.data(), dtype, kBlocks, kLayers, kHeads, kBlock, kDim, layer);
      w.num_tokens = kTokens;
      w.positions = positions.data();
      w.token_seq = token_seq.data();
      w.block_tables = tables.data();
      w.num_seqs = 2;
      w.max_blocks_per_seq = 3;
      reference::WriteKv(w);
    }
    const KvCacheView c =
        DenseKvCacheView(storage.data(), dtype, kBlocks, kLayers, kHeads, kBlock, kDim, 1);
    std::vector<float> want_k(kTokens * kStride, -1.0f), want_v = want_k;
    ReadKvParams r;
    r.k = want_k.data();
    r.v = want_v.data();
    r.k_token_stride = r.v_token_stride = kStride;
    r.cache = c;
    r.num_tokens = kTokens;
    r.positions = positions.data();
    r.token_seq = token_seq.data();
    r.block_tables = tables.data();
    r.num_seqs = 2;
    r.max_blocks_per_seq = 3;
    reference::ReadKv(r);
    std::vector<float> got_k(kTokens * kStride, -1.0f), got_v = got_k;
    const LaunchShape s = ReadKvLaunch(kTokens, kHeads, kDim);
    ASSERT_EQ(s.grid, kTokens);
    ASSERT_EQ(s.threads, 256);
    for (int64_t j = 0; j < s.grid; ++j) {
      const int64_t pos = positions[j];
      const int64_t block = tables[BlockTableIndex(token_seq[j], 3, pos, kBlock)];
      for (int64_t tid = 0; tid < s.threads; ++tid) {
        for (int64_t e = tid; e < kElems; e += s.threads) {
          got_k[j * kStride + e] = ReadKvElement(c, block, pos, e, /*value=*/false);
          got_v[j * kStride + e] = ReadKvElement(c, block, pos, e, /*value=*/true);
        }
      }
    }
    const std::string name = "dtype " + std::to_string(static_cast<int>(dtype));
    EXPECT_EQ(std::memcmp(got_k.data(), want_k.data(), got_k.size() * 4), 0) << name;
    EXPECT_EQ(std::memcmp(got_v.data(), want_v.data(), got_v.size() * 4), 0) << name;
    if (dtype == DType::kI4) {
      // The kernel's i4 branch: one thread per (K or V, kv head) row, ReadKvI4Row.
      std::vector<float> row_k(kTokens * kStride, -1.0f), row_v = row_k;
      for (int64_t j = 0; j < kTokens; ++j) {
        const int64_t pos = positions[j];
        const int64_t block = tables[BlockTableIndex(token_seq[j], 3, pos, kBlock)];
        for (int64_t r = 0; r < 2 * kHeads; ++r) {
          const bool value = r >= kHeads;
          float* dst = (value ? row_v.data() : row_k.data()) + j * kStride + (r % kHeads) * kDim;
          ReadKvI4Row(c, block, r % kHeads, pos, value, dst);
        }
      }
      EXPECT_EQ(std::memcmp(row_k.data(), want_k.data(), row_k.size() * 4), 0);
      EXPECT_EQ(std::memcmp(row_v.data(), want_v.data(), row_v.size() * 4), 0);
    }
    if (IsQuantizedKvDType(dtype)) {  // the special rows really are special
      EXPECT_TRUE(std::isnan(got_k[1 * kStride + kDim])) << name;
      EXPECT_TRUE(std::isnan(got_v[2 * kStride])) << name;
      EXPECT_EQ(got_k[3 * kStride + 5], 0.0f) << name;
    }
  }
}

// attention.cu's WarpHadamard on the host: lanes[l] is lane l's register.
void WarpHadamardOnHost(float* lanes, int group) {
  for (int h = 1; h < group; h *= 2) {
    float next[kWarpSize];
    for (int l = 0; l < kWarpSize; ++l) {
      next[l] = HadamardButterfly(lanes[l], lanes[l ^ h], l, h);
    }
    std::copy(next, next + kWarpSize, lanes);
  }
  for (int l = 0; l < kWarpSize; ++l) lanes[l] = MulRn(lanes[l], HadamardScale(group));
}

// The i4 helpers the kernels share with the host: HadamardRotateRn and the warp's butterflies
// (HadamardButterfly over 32 lanes, as WarpHadamard shuffles them) give HadamardRotate's bits,
// for every group size an i4 cache rotates.
TEST(CudaLaunchTest, I4RotationsAreBitwiseTheCpus) {
  std::mt19937 rng(31);
  for (int64_t n : {2, 4, 8, 16, 32}) {
    for (int trial = 0; trial < 20; ++trial) {
      std::vector<float> x = Random(kWarpSize, rng);
      x[trial % kWarpSize] *= 1e6f;  // an outlier, so roundings differ by order
      std::vector<float> want = x;
      for (int64_t g = 0; g < kWarpSize; g += n) HadamardRotate(want.data() + g, n);
      std::vector<float> serial = x;
      for (int64_t g = 0; g < kWarpSize; g += n) HadamardRotateRn(serial.data() + g, n);
      std::vector<float> lanes = x;
      WarpHadamardOnHost(lanes.data(), static_cast<int>(n));
      ASSERT_EQ(std::memcmp(serial.data(), want.data(), kWarpSize * 4), 0) << n;
      ASSERT_EQ(std::memcmp(lanes.data(), want.data(), kWarpSize * 4), 0) << n;
    }
  }
}

// WriteKvKernel on an i4 cache emulated (one thread per (K or V, kv head) row, QuantizeI4Row
// at KvElementOffset / KvScaleByteOffset) against the reference WriteKv, bytes and scales: for
// rotated groups of 32 and of a whole small row (8, 16), an unrotated whole row (48), several
// groups (64, 96, 256), and rows holding NaN, inf, zeros and an outlier.
TEST(CudaLaunchTest, WriteKvI4EmulationMatchesReferenceBitwise) {
  constexpr int64_t kLayers = 2, kHeads = 2, kBlock = 4, kBlocks = 3, kTokens = 6;
  const std::vector<int32_t> table = {2, 0};
  const std::vector<int32_t> positions = {0, 1, 2, 3, 4, 7};
  for (int64_t dim : {8, 16, 48, 64, 96, 256}) {
    SCOPED_TRACE(dim);
    std::mt19937 rng(static_cast<uint32_t>(dim));
    const int64_t elems = kHeads * dim;
    std::vector<float> k = Random(kTokens * elems, rng), v = Random(kTokens * elems, rng);
    k[1 * elems + dim + 3] = std::nanf("");
    v[2 * elems + 1] = -std::numeric_limits<float>::infinity();
    std::fill(k.begin() + 3 * elems, k.begin() + 3 * elems + dim, 0.0f);
    v[4 * elems + 5] = 3e4f;
    const int64_t bytes = kBlocks * DenseKvBlockBytes(DType::kI4, kLayers, kHeads, kBlock, dim);
    std::vector<uint8_t> want(static_cast<size_t>(bytes), 0xab), got = want;
    const KvCacheView wv =
        DenseKvCacheView(want.data(), DType::kI4, kBlocks, kLayers, kHeads, kBlock, dim, 1);
    WriteKvParams w;
    w.k = k.data();
    w.v = v.data();
    w.k_token_stride = w.v_token_stride = elems;
    w.cache = wv;
    w.num_tokens = kTokens;
    w.positions = positions.data();
    w.block_tables = table.data();
    w.max_blocks_per_seq = 2;
    reference::WriteKv(w);
    KvCacheView c = wv;
    c.base = got.data();
    for (int64_t j = 0; j < kTokens; ++j) {
      const int64_t pos = positions[j];
      const int64_t block = table[pos / kBlock];
      for (int64_t r = 0; r < 2 * kHeads; ++r) {
        const bool value = r >= kHeads;
        const int64_t h = r % kHeads;
        const float* x = (value ? v.data() : k.data()) + j * elems + h * dim;
        QuantizeI4Row(
            x, dim, got.data() + KvElementOffset(c, block, h, pos, value),
            reinterpret_cast<float*>(got.data() + KvScaleByteOffset(c, block, h, pos, value)));
      }
    }
    EXPECT_EQ(got, want);
  }
}

// AttendRow's i4 branch on the host: the query rotated across lanes (WarpHadamard), keys and
// values as code * group scale (KvI4Code, KvI4Scale) in the cache's rotated space, each warp's
// accumulators rotated back before the merge. Against the reference PrefillAttention (which
// reads every row rotated back, in double), for rotated groups (head_dim 8: one group; 64: two
// of 32) and an unrotated one (48), GQA 4/2.
TEST(CudaLaunchTest, PrefillAttentionI4EmulationMatchesReference) {
  constexpr int64_t kLayers = 2, kKvHeads = 2, kHeads = 4, kBlock = 4, kBlocks = 5;
  const std::vector<int32_t> table = {3, 0, 4, 1};
  const int64_t start_pos = 6, num_tokens = 7;  // positions 6..12 over 4 blocks
  for (int64_t dim : {8, 48, 64}) {
    SCOPED_TRACE(dim);
    std::mt19937 rng(static_cast<uint32_t>(40 + dim));
    const int64_t bytes = kBlocks * DenseKvBlockBytes(DType::kI4, kLayers, kKvHeads, kBlock, dim);
    std::vector<uint8_t> pool(static_cast<size_t>(bytes), 0);
    const KvCacheView c =
        DenseKvCacheView(pool.data(), DType::kI4, kBlocks, kLayers, kKvHeads, kBlock, dim, 1);
    const int64_t total = start_pos + num_tokens, kv_elems = kKvHeads * dim;
    std::vector<int32_t> positions(total);
    std::iota(positions.begin(), positions.end(), 0);
    const std::vector<float> k = Random(total * kv_elems, rng), v = Random(total * kv_elems, rng);
    WriteKvParams w;
    w.k = k.data();
    w.v = v.data();
    w.k_token_stride = w.v_token_stride = kv_elems;
    w.cache = c;
    w.num_tokens = total;
    w.positions = positions.data();
    w.block_tables = table.data();
    w.max_blocks_per_seq = 4;
    reference::WriteKv(w);
    const int64_t row = kHeads * dim;
    const std::vector<float> q = Random(num_tokens * row, rng);
    std::vector<float> got(num_tokens * row, 0.0f), want = got;
    PrefillAttentionParams p;
    p.q = q.data();
    p.out = want.data();
    p.q_token_stride = p.out_token_stride = row;
    p.cache = c;
    p.block_table = table.data();
    p.num_table_blocks = 4;
    p.start_pos = start_pos;
    p.num_tokens = num_tokens;
    p.num_heads = kHeads;
    reference::PrefillAttention(p);
    const float scale = AttentionScale(0.0f, dim);
    const bool rotated = KvRotated(DType::kI4, dim);
    const int group = static_cast<int>(KvScaleGroup(DType::kI4, dim));
    EXPECT_EQ(rotated, dim != 48);
    const LaunchShape s = AttentionLaunch(num_tokens, kHeads, dim);
    for (int64_t b = 0; b < s.grid; ++b) {
      const RowHead rh = RowHeadAt(b, kHeads);
      const int64_t kv_head = KvHeadOf(rh.head, kHeads, kKvHeads);
      const int64_t num_keys = PrefillNumKeys(start_pos, rh.row);
      const float* qh = q.data() + rh.row * row + rh.head * dim;
      // qr[j][lane], acc[warp][j][lane]: the registers.
      std::vector<std::vector<float>> qr(kMaxDimsPerLane, std::vector<float>(kWarpSize, 0.0f));
      for (int j = 0; j < kMaxDimsPerLane; ++j) {
        for (int lane = 0; lane < kWarpSize; ++lane) {
          const int64_t d = lane + j * kWarpSize;
          qr[j][lane] = d < dim ? qh[d] * scale : 0.0f;
        }
        if (rotated) WarpHadamardOnHost(qr[j].data(), group);
      }
      SoftmaxState state[kAttentionWarps];
      std::vector<float> acc(kAttentionWarps * kMaxDimsPerLane * kWarpSize, 0.0f);
      for (int warp = 0; warp < kAttentionWarps; ++warp) {
        for (int64_t t = warp; t < num_keys; t += kAttentionWarps) {
          const int64_t block_id = table[t / kBlock];
          const int64_t k_off = KvElementOffset(c, block_id, kv_head, t, false);
          float dot = 0.0f;
          for (int lane = 0; lane < kWarpSize; ++lane) {
            for (int j = 0; j < kMaxDimsPerLane; ++j) {
              const int64_t d = lane + j * kWarpSize;
              if (d < dim) {
                dot += qr[j][lane] * MulRn(KvI4Code(c.base, k_off, d),
                                           KvI4Scale(c, block_id, kv_head, t, false, d / group));
              }
            }
          }
          const SoftmaxStep step = OnlineSoftmaxUpdate(&state[warp], dot);
          for (int j = 0; j < kMaxDimsPerLane; ++j) {
            for (int lane = 0; lane < kWarpSize; ++lane) {
              const int64_t d = lane + j * kWarpSize;
              if (d < dim) {
                float& a = acc[(warp * kMaxDimsPerLane + j) * kWarpSize + lane];
                a = a * step.correction +
                    step.weight * MulRn(KvI4Code(c.base, k_off + c.kv_stride, d),
                                        KvI4Scale(c, block_id, kv_head, t, true, d / group));
              }
            }
          }
        }
        if (rotated) {
          for (int j = 0; j < kMaxDimsPerLane; ++j) {
            WarpHadamardOnHost(&acc[(warp * kMaxDimsPerLane + j) * kWarpSize], group);
          }
        }
      }
      float global_max = -INFINITY, total_sum = 0.0f, factor[kAttentionWarps];
      for (const SoftmaxState& st : state) global_max = std::max(global_max, st.max);
      for (int w2 = 0; w2 < kAttentionWarps; ++w2) {
        factor[w2] = WarpMergeFactor(state[w2], global_max);
        total_sum += state[w2].sum * factor[w2];
      }
      float* out = got.data() + rh.row * row + rh.head * dim;
      for (int64_t d = 0; d < dim; ++d) {
        float o = 0.0f;
        for (int w2 = 0; w2 < kAttentionWarps; ++w2) {
          o += acc[(w2 * kMaxDimsPerLane + d / kWarpSize) * kWarpSize + d % kWarpSize] * factor[w2];
        }
        out[d] = o / total_sum;
      }
    }
    for (size_t i = 0; i < got.size(); ++i) {
      ASSERT_NEAR(got[i], want[i], 2e-5f) << i;
    }
  }
}

// KvScaleByteOffset addresses the scale the reference WriteKv stores for each (layer, K or V,
// kv head, position) of a quantized cache: rows of distinct amax, read back at the offset.
TEST(CudaLaunchTest, KvScaleOffsetMatchesTheReferenceLayout) {
  constexpr int64_t kLayers = 2, kHeads = 3, kBlock = 4, kDim = 8, kBlocks = 3;
  const int64_t block_bytes = DenseKvBlockBytes(DType::kI8, kLayers, kHeads, kBlock, kDim);
  std::vector<float> storage(static_cast<size_t>(kBlocks * block_bytes / 4 + 1), 0.0f);
  void* base = storage.data();
  const std::vector<int32_t> table = {2, 0};
  float amax = 1.0f;
  for (int64_t layer = 0; layer < kLayers; ++layer) {
    const KvCacheView c =
        DenseKvCacheView(base, DType::kI8, kBlocks, kLayers, kHeads, kBlock, kDim, layer);
    for (int32_t pos : {0, 3, 5}) {
      std::vector<float> k(kHeads * kDim, 0.0f), v(kHeads * kDim, 0.0f);
      std::vector<float> want_k(kHeads), want_v(kHeads);
      for (int64_t h = 0; h < kHeads; ++h) {
        k[h * kDim + 1] = amax;
        v[h * kDim + 2] = -(amax + 0.5f);
        want_k[h] = amax / 127.0f;
        want_v[h] = (amax + 0.5f) / 127.0f;
        amax += 1.0f;
      }
      WriteKvParams p;
      p.k = k.data();
      p.v = v.data();
      p.k_token_stride = p.v_token_stride = kHeads * kDim;
      p.cache = c;
      p.num_tokens = 1;
      p.positions = &pos;
      p.block_tables = table.data();
      p.max_blocks_per_seq = 2;
      reference::WriteKv(p);
      const int64_t block = table[pos / kBlock];
      for (int64_t h = 0; h < kHeads; ++h) {
        float got_k = 0, got_v = 0;
        std::memcpy(&got_k, static_cast<char*>(base) + KvScaleByteOffset(c, block, h, pos, false),
                    4);
        std::memcpy(&got_v, static_cast<char*>(base) + KvScaleByteOffset(c, block, h, pos, true),
                    4);
        EXPECT_EQ(got_k, want_k[h]) << "layer " << layer << " pos " << pos << " head " << h;
        EXPECT_EQ(got_v, want_v[h]) << "layer " << layer << " pos " << pos << " head " << h;
        const int64_t off = KvScaleByteOffset(c, block, h, pos, true);
        EXPECT_GE(off, block * block_bytes + c.scale_offset);
        EXPECT_LE(off + 4, (block + 1) * block_bytes);
      }
    }
  }
}

// Rank order of kernels/sampling_params.h: logit descending, then id ascending.
bool Before(float a, int32_t ia, float b, int32_t ib) { return a > b || (a == b && ia < ib); }

TEST(CudaLaunchTest, SamplingRankKeyFollowsRankOrder) {
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> logits = {0.0f,
                               -0.0f,
                               1.0f,
                               -1.0f,
                               inf,
                               -inf,
                               1e-30f,
                               -1e-30f,
                               3.5f,
                               3.5f,
                               std::numeric_limits<float>::denorm_min(),
                               -65504.0f,
                               1.0f};
  std::mt19937 rng(6);
  for (float x : Random(50, rng)) {
    logits.push_back(x);
  }
  for (size_t a = 0; a < logits.size(); ++a) {
    for (size_t b = 0; b < logits.size(); ++b) {
      const int32_t ia = static_cast<int32_t>(a), ib = static_cast<int32_t>(b);
      EXPECT_EQ(SamplingRankKey(logits[a], ia) < SamplingRankKey(logits[b], ib),
                Before(logits[a], ia, logits[b], ib))
          << logits[a] << "@" << a << " vs " << logits[b] << "@" << b;
    }
  }
}

TEST(CudaLaunchTest, DrawChunksSplitInOrderInWholeSteps) {
  for (int64_t n : {1, 5, 31, 32, 33, 1000, 1024, 1025, 32000, 128256}) {
    int64_t next = 0;
    for (int64_t w = 0; w < kSamplingWarps; ++w) {
      const Segment s = DrawChunkOf(w, n, kSamplingWarps);
      ASSERT_EQ(s.begin, next) << n << " " << w;
      ASSERT_LE(s.begin, s.end);
      ASSERT_TRUE(s.begin == n || s.begin % kWarpSize == 0) << n << " " << w;
      next = s.end;
    }
    EXPECT_EQ(next, n);
  }
  EXPECT_EQ(SamplingLaunch(9).grid, 9);
  EXPECT_EQ(SamplingLaunch(9).threads % kWarpSize, 0);
  EXPECT_LE(SamplingLaunch(9).threads, kMaxThreadsPerBlock);
}

TEST(CudaLaunchTest, RadixStateAndPicks) {
  RadixState s;
  EXPECT_EQ(RadixLimit(s), ~uint64_t{0});
  EXPECT_EQ(RadixShift(0), 56);
  EXPECT_EQ(RadixShift(kRadixPasses - 1), 0);
  s = RadixDescend(s, 0xab, RadixShift(0));
  EXPECT_EQ(RadixLimit(s), 0xabffffffffffffffull);
  EXPECT_TRUE(RadixOpen(0xab00000000000000ull, s));
  EXPECT_FALSE(RadixOpen(0xac00000000000000ull, s));
  EXPECT_EQ(RadixDigit(0xab12000000000000ull, RadixShift(1)), 0x12);
  const uint32_t counts[4] = {2, 0, 3, 1};
  const uint64_t masses[4] = {10, 0, 5, 7};
  RadixPick p = PickBin(counts, masses, 4, /*by_mass=*/false, 3);
  EXPECT_EQ(p.bin, 2);
  EXPECT_EQ(p.below_count, 2u);
  EXPECT_EQ(p.below_mass, 10u);
  p = PickBin(counts, masses, 4, /*by_mass=*/true, 10);
  EXPECT_EQ(p.bin, 0);
  p = PickBin(counts, masses, 4, /*by_mass=*/true, 16);
  EXPECT_EQ(p.bin, 3);
  EXPECT_EQ(p.below_mass, 15u);
  EXPECT_EQ(DrawNeed(0.0, 100), 1u);
  EXPECT_EQ(DrawNeed(0.999999, 100), 100u);
  EXPECT_EQ(DrawNeed(0.5, 100), 51u);  // the first cumulative sum exceeding 50
  EXPECT_EQ(TopPNeed(0.5f, 100), 50u);
  EXPECT_EQ(TopPNeed(1e-9f, 100), 1u);
  EXPECT_EQ(FixedWeight(1.0f, 1.0f, 1.0f), uint64_t{1} << 36);
  EXPECT_EQ(FixedWeight(-30.0f, 0.0f, 1.0f), 0u);
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(FixedWeight(inf, inf, 1.0f), uint64_t{1} << 36);
  EXPECT_EQ(FixedWeight(5.0f, inf, 1.0f), 0u);
  EXPECT_EQ(FixedWeight(-inf, -inf, 1.0f), uint64_t{1} << 36);
}

// SampleRowRadix's Row, run serially: the same passes as the kernel's BlockRow, each a loop
// over the row, and the draw over the kernel's warp chunks in 32-id steps. Counts passes.
class HostRow {
 public:
  HostRow(const float* row, int64_t vocab) : row_(row), vocab_(vocab) {}

  RowSummary Summarize() {
    ++passes;
    RowSummary s;
    s.argmax = INT32_MAX;
    for (int64_t i = 0; i < vocab_; ++i) {
      const float v = row_[i];
      if (v == v) {
        ++s.count;
        if (v > s.max || (v == s.max && i < s.argmax)) {
          s.max = v;
          s.argmax = static_cast<int32_t>(i);
        }
      }
    }
    if (s.count == 0) {
      s.argmax = 0;
    }
    return s;
  }
  void SetWeights(float max_logit, float inv_t) {
    max_ = max_logit;
    inv_t_ = inv_t;
  }
  int64_t CountAtLeast(float min_p) {
    ++passes;
    int64_t count = 0;
    for (int64_t i = 0; i < vocab_; ++i) {
      const float v = row_[i];
      count += v == v && MinPKeeps(v, max_, inv_t_, min_p) ? 1 : 0;
    }
    return count;
  }
  void Histogram(RadixState s, int shift, uint64_t limit) {
    ++passes;
    std::fill(std::begin(counts_), std::end(counts_), 0u);
    std::fill(std::begin(masses_), std::end(masses_), 0u);
    for (int64_t i = 0; i < vocab_; ++i) {
      const float v = row_[i];
      if (v != v) {
        continue;
      }
      const uint64_t key = SamplingRankKey(v, static_cast<int32_t>(i));
      const uint64_t w = FixedWeight(v, max_, inv_t_);
      if (key <= limit && RadixOpen(key, s) && w > 0) {
        counts_[RadixDigit(key, shift)] += 1;
        masses_[RadixDigit(key, shift)] += w;
      }
    }
  }
  const uint32_t* counts() const { return counts_; }
  const uint64_t* masses() const { return masses_; }
  RadixPick Pick(bool by_mass, uint64_t need) {
    return PickBin(counts_, masses_, kRadixBins, by_mass, need);
  }
  int32_t Draw(uint64_t limit, double u) {
    ++passes;
    uint64_t chunk_mass[kSamplingWarps] = {};
    uint64_t total = 0;
    for (int w = 0; w < kSamplingWarps; ++w) {
      const Segment c = DrawChunkOf(w, vocab_, kSamplingWarps);
      for (int64_t i = c.begin; i < c.end; ++i) {
        chunk_mass[w] += Weight(i, limit);
      }
      total += chunk_mass[w];
    }
    const uint64_t need = DrawNeed(u, total);
    uint64_t before = 0;
    for (int w = 0; w < kSamplingWarps; ++w) {
      if (before < need && before + chunk_mass[w] >= need) {
        const Segment c = DrawChunkOf(w, vocab_, kSamplingWarps);
        uint64_t cum = before;
        for (int64_t first = c.begin; first < c.end; first += kWarpSize) {
          for (int64_t i = first; i < std::min(first + kWarpSize, c.end); ++i) {
            cum += Weight(i, limit);
            if (cum >= need) {
              return static_cast<int32_t>(i);
            }
          }
        }
        ADD_FAILURE() << "chunk " << w << " holds the crossing but the walk missed it";
      }
      before += chunk_mass[w];
    }
    ADD_FAILURE() << "no chunk holds the crossing: need " << need << " of " << total;
    return -1;
  }

  int passes = 0;

 private:
  uint64_t Weight(int64_t i, uint64_t limit) const {
    const float v = row_[i];
    if (v != v || SamplingRankKey(v, static_cast<int32_t>(i)) > limit) {
      return 0;
    }
    return FixedWeight(v, max_, inv_t_);
  }

  const float* row_;
  int64_t vocab_;
  float max_ = 0.0f, inv_t_ = 1.0f;
  uint32_t counts_[kRadixBins] = {};
  uint64_t masses_[kRadixBins] = {};
};

int32_t ReferenceToken(const std::vector<float>& row, float temperature, int32_t top_k, float top_p,
                       uint64_t seed, uint64_t step, float min_p = 0.0f) {
  int32_t want = -1;
  SamplingParams p;
  p.min_p = &min_p;
  p.logits = row.data();
  p.out_tokens = &want;
  p.num_seqs = 1;
  p.vocab_size = p.logits_stride = static_cast<int64_t>(row.size());
  p.temperature = &temperature;
  p.top_k = &top_k;
  p.top_p = &top_p;
  p.seeds = &seed;
  p.steps = &step;
  reference::Sample(p);
  return want;
}

TEST(CudaLaunchTest, SamplingRadixMatchesReference) {
  std::mt19937 rng(7);
  int mismatches = 0, rows = 0;
  // 300: fewer ids than threads; 5000: chunks of several steps with a short tail.
  for (int64_t vocab : {300, 5000}) {
    for (int32_t top_k : {0, 1, 5, 50, 299, 300, -1}) {
      for (float top_p : {1.0f, 0.9f, 0.3f, 1e-6f}) {
        for (float temperature : {0.7f, 1.0f, 3.0f}) {
          for (uint64_t seed = 0; seed < 3; ++seed) {
            std::vector<float> row = Random(vocab, rng);
            for (float& x : row) {
              x *= 4.0f;
            }
            row[17] = std::numeric_limits<float>::quiet_NaN();
            row[40] = row[41];  // a tie, broken by id
            row[100] = row[3];
            const uint64_t step = seed * 3 + 1;
            const int32_t want = ReferenceToken(row, temperature, top_k, top_p, seed, step);
            HostRow host(row.data(), vocab);
            const int32_t got =
                SampleRowRadix(host, temperature, 0.0f, top_k, top_p, SamplingUniform(seed, step));
            ++rows;
            mismatches += got != want ? 1 : 0;
            EXPECT_LE(host.passes, 2 + 2 * kRadixPasses);
          }
        }
      }
    }
  }
  // Fixed-point weights vs the reference's doubles can move a draw that lands within ~1e-10 of
  // a boundary; with these seeds none does.
  EXPECT_EQ(mismatches, 0) << "of " << rows;
}

// min-p becomes a top-k cut of the count it keeps: the same tokens as the reference's rule,
// alone and with top-k and top-p after it, one pass more than without.
TEST(CudaLaunchTest, SamplingRadixMinPMatchesReference) {
  std::mt19937 rng(11);
  int mismatches = 0, rows = 0;
  for (float min_p : {1e-4f, 0.05f, 0.3f, 0.9f, 1.0f}) {
    for (int32_t top_k : {0, 3, 40}) {
      for (float top_p : {1.0f, 0.8f}) {
        for (uint64_t seed = 0; seed < 4; ++seed) {
          std::vector<float> row = Random(700, rng);
          for (float& x : row) {
            x *= 3.0f;
          }
          row[5] = std::numeric_limits<float>::quiet_NaN();
          row[9] = row[10];
          const float temperature = 0.8f;
          const int32_t want = ReferenceToken(row, temperature, top_k, top_p, seed, 3, min_p);
          HostRow host(row.data(), 700);
          const int32_t got =
              SampleRowRadix(host, temperature, min_p, top_k, top_p, SamplingUniform(seed, 3));
          ++rows;
          mismatches += got != want ? 1 : 0;
          EXPECT_LE(host.passes, 3 + 2 * kRadixPasses);
        }
      }
    }
  }
  EXPECT_EQ(mismatches, 0) << "of " << rows;
  // min_p 1 keeps only the maximum (here a tie of two: both drawn over seeds, nothing else).
  const std::vector<float> tie = {1.0f, 4.0f, 3.9f, 4.0f};
  for (uint64_t seed = 0; seed < 20; ++seed) {
    HostRow host(tie.data(), 4);
    const int32_t t = SampleRowRadix(host, 1.0f, 1.0f, 0, 1.0f, SamplingUniform(seed, 1));
    EXPECT_TRUE(t == 1 || t == 3) << t;
    EXPECT_EQ(t, ReferenceToken(tie, 1.0f, 0, 1.0f, seed, 1, 1.0f));
  }
}

TEST(CudaLaunchTest, SamplingRadixEdgeRows) {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  struct Case {
    std::vector<float> row;
    float temperature;
    int32_t top_k;
    float top_p;
  };
  const std::vector<Case> cases = {
      {{nan, nan, nan}, 1.0f, 0, 1.0f},             // all NaN: token 0
      {{1.0f, 3.0f, 3.0f, 2.0f}, 0.0f, 0, 1.0f},    // greedy tie: lowest id
      {{1.0f, 3.0f, 3.0f, 2.0f}, nan, 0, 1.0f},     // NaN temperature: greedy
      {{-inf, -inf, -inf}, 1.0f, 0, 1.0f},          // all -inf: uniform
      {{-inf, -inf, -inf}, 1.0f, 2, 1.0f},          // all -inf, top-k: the two lowest ids
      {{1.0f, inf, 0.0f, inf}, 1.0f, 0, 1.0f},      // +inf logits share the mass
      {{5.0f, 5.0f, 5.0f, 5.0f}, 1.0f, 3, 0.5f},    // ties throughout: cut by id
      {{0.0f, -0.0f, 0.0f}, 1.0f, 2, 1.0f},         // signed zeros rank equal
      {{2.0f, -100.0f, 1.0f, nan}, 0.5f, 3, 1.0f},  // a zero-weight candidate inside top-k
  };
  for (size_t c = 0; c < cases.size(); ++c) {
    const Case& k = cases[c];
    for (uint64_t seed = 0; seed < 20; ++seed) {
      HostRow host(k.row.data(), static_cast<int64_t>(k.row.size()));
      EXPECT_EQ(
          SampleRowRadix(host, k.temperature, 0.0f, k.top_k, k.top_p, SamplingUniform(seed, 5)),
          ReferenceToken(k.row, k.temperature, k.top_k, k.top_p, seed, 5))
          << "case " << c << " seed " << seed;
    }
  }
  // Temperatures below kMinSamplingTemperature (subnormals, whose reciprocal is +inf, too) are
  // greedy, with the reference's token; at the threshold the ties and the near-tie are drawn.
  const std::vector<float> near = {1.0f, 7.0f, 7.0f, 7.0f - 1e-5f, 3.0f};
  for (float t : {0.0f, -0.0f, std::numeric_limits<float>::denorm_min(), 1e-42f, 1e-39f, 1e-38f,
                  1e-6f, std::nextafter(kMinSamplingTemperature, 0.0f)}) {
    for (uint64_t seed = 0; seed < 20; ++seed) {
      HostRow host(near.data(), static_cast<int64_t>(near.size()));
      EXPECT_EQ(SampleRowRadix(host, t, 0.0f, 0, 1.0f, SamplingUniform(seed, 5)), 1) << t;
      EXPECT_EQ(ReferenceToken(near, t, 0, 1.0f, seed, 5), 1) << t;
    }
  }
  int drawn[5] = {};
  for (uint64_t seed = 0; seed < 200; ++seed) {
    HostRow host(near.data(), static_cast<int64_t>(near.size()));
    const int32_t token =
        SampleRowRadix(host, kMinSamplingTemperature, 0.0f, 0, 1.0f, SamplingUniform(seed, 5));
    EXPECT_EQ(token, ReferenceToken(near, kMinSamplingTemperature, 0, 1.0f, seed, 5));
    ASSERT_GE(token, 1);
    ASSERT_LE(token, 3);
    ++drawn[token];
  }
  EXPECT_GT(drawn[1], 0);
  EXPECT_GT(drawn[2], 0);
  EXPECT_GT(drawn[3], 0);

  // Greedy reads the row once.
  const std::vector<float> row = {1.0f, 2.0f};
  HostRow host(row.data(), 2);
  EXPECT_EQ(SampleRowRadix(host, 0.0f, 0.0f, 0, 1.0f, 0.5), 1);
  EXPECT_EQ(host.passes, 1);
}

TEST(CudaLaunchTest, CopyAccessAndSegments) {
  alignas(16) static char buf[256];
  EXPECT_EQ(CopyAccessBytes(buf, buf + 64, 4096, 8192, 1024), 16);
  EXPECT_EQ(CopyAccessBytes(buf, buf + 8, 4096, 8192, 1024), 8);
  EXPECT_EQ(CopyAccessBytes(buf, buf, 4096, 4098, 1024), 2);
  EXPECT_EQ(CopyAccessBytes(buf + 1, buf, 4096, 4096, 1024), 1);
  EXPECT_EQ(CopyAccessBytes(buf, buf, 4096, 4096, 1028), 4);
  EXPECT_EQ(CopySegmentsPerBlock(1), 1);
  EXPECT_EQ(CopySegmentsPerBlock(kCopySegmentBytes), 1);
  EXPECT_EQ(CopySegmentsPerBlock(kCopySegmentBytes + 1), 2);
  EXPECT_EQ(CopyBlocksLaunch(3, 2 * kCopySegmentBytes + 48).grid, 9);
}

// CopyBlocks through the kernel's (segment, word) decomposition: a gather with scattered ids and
// a tail segment, compared with reference::CopyBlocks byte for byte.
TEST(CudaLaunchTest, CopyBlocksEmulationMatchesReference) {
  const int64_t block_bytes = 2 * kCopySegmentBytes + 48, src_stride = block_bytes + 16;
  const int64_t src_blocks = 5, copies = 3;
  std::vector<unsigned char> src(src_blocks * src_stride);
  std::mt19937 rng(8);
  for (unsigned char& b : src) {
    b = static_cast<unsigned char>(rng());
  }
  const std::vector<int32_t> ids = {4, 0, 2};
  std::vector<unsigned char> got(copies * block_bytes, 0), want(copies * block_bytes, 0);
  CopyBlocksParams p;
  p.src = src.data();
  p.dst = want.data();
  p.src_ids = ids.data();
  p.num_copies = copies;
  p.block_bytes = block_bytes;
  p.src_block_stride_bytes = src_stride;
  p.dst_block_stride_bytes = block_bytes;
  p.src_num_blocks = src_blocks;
  p.dst_num_blocks = copies;
  reference::CopyBlocks(p);
  const int access = 16;  // both strides and block_bytes are multiples of 16
  const LaunchShape s = CopyBlocksLaunch(copies, block_bytes);
  const int64_t per_block = CopySegmentsPerBlock(block_bytes);
  std::vector<int> hits(got.size(), 0);
  for (int64_t b = 0; b < s.grid; ++b) {
    const CopySegment seg = CopySegmentAt(b, per_block, block_bytes);
    ASSERT_EQ((seg.end - seg.begin) % access, 0);
    const unsigned char* from = src.data() + ids[seg.copy] * src_stride + seg.begin;
    unsigned char* to = got.data() + seg.copy * block_bytes + seg.begin;
    for (int64_t tid = 0; tid < s.threads; ++tid) {
      for (int64_t w = tid; w < (seg.end - seg.begin) / access; w += s.threads) {
        std::copy(from + w * access, from + (w + 1) * access, to + w * access);
        for (int i = 0; i < access; ++i) {
          ++hits[(to - got.data()) + w * access + i];
        }
      }
    }
  }
  EXPECT_TRUE(std::all_of(hits.begin(), hits.end(), [](int h) { return h == 1; }));
  EXPECT_EQ(got, want);
}

TEST(CudaLaunchTest, MatMulTilesAndWorkspace) {
  MatMulParams p;
  p.num_rows = 3;
  p.in_features = 4096;
  p.out_features = 14336;
  p.x_row_stride = 4096;
  p.y_row_stride = 14336;
  EXPECT_EQ(MatMulTileRows(p), 14336);
  EXPECT_EQ(MatMulWorkspaceBytes(p), 0);
  // bf16: one native GEMM; the workspace holds x rounded to bf16.
  p.w_dtype = DType::kBF16;
  EXPECT_TRUE(MatMulNativeBf16(p));
  EXPECT_EQ(MatMulTileRows(p), 14336);
  EXPECT_EQ(MatMulWorkspaceBytes(p), 3 * 4096 * 2);
  // f16: widened tiles of f32 weight rows.
  p.w_dtype = DType::kF16;
  EXPECT_FALSE(MatMulNativeBf16(p));
  EXPECT_EQ(MatMulTileRows(p), 2048);
  EXPECT_EQ(MatMulWorkspaceBytes(p), 2048 * 4096 * 4);
  p.in_features = int64_t{16} << 20;  // one f32 row exceeds the tile budget: still one row
  EXPECT_EQ(MatMulTileRows(p), 1);
  p.in_features = 10;
  p.out_features = 7;
  EXPECT_EQ(MatMulTileRows(p), 7);
  EXPECT_EQ(MatMulWorkspaceBytes(p), 7 * 10 * 4);
}

// Column-major C = op_T(A) * B as cuBLAS computes it (lda/ldb/ldc in elements).
void HostSgemmTN(int m, int n, int k, const float* a, int lda, const float* b, int ldb, float beta,
                 float* c, int ldc) {
  for (int j = 0; j < n; ++j) {
    for (int i = 0; i < m; ++i) {
      double acc = 0.0;
      for (int l = 0; l < k; ++l) {
        acc += static_cast<double>(a[i * lda + l]) * b[j * ldb + l];  // A^T(i, l) = A(l, i)
      }
      c[j * ldc + i] = static_cast<float>(acc + beta * c[j * ldc + i]);
    }
  }
}

// 3 rows of x (stride 6) by 5 inputs into 7 outputs (y stride 9): padding on both sides.
MatMulParams SmallMatMul(bool accumulate, DType w_dtype) {
  MatMulParams p;
  p.num_rows = 3;
  p.in_features = 5;
  p.out_features = 7;
  p.x_row_stride = 6;
  p.y_row_stride = 9;
  p.accumulate = accumulate;
  p.w_dtype = w_dtype;
  return p;
}

// The bias step of the cuBLAS MatMul path: LaunchBiasInit's grid-stride items over y.
void EmulateBiasInit(const MatMulParams& p, const std::vector<float>& bias, std::vector<float>* y) {
  const int64_t items = p.num_rows * p.out_features;
  ForEachGridStrideItem(ElementwiseLaunch(items), items, [&](int64_t i) {
    const RowCol rc = RowColAt(i, p.out_features);
    float& v = (*y)[rc.row * p.y_row_stride + rc.col];
    v = (p.accumulate ? v : 0.0f) + bias[rc.col];
  });
}

// The cuBLAS MatMul path emulated with its GemmCall tiles: bias step, then per tile the f16
// weight rows widened to f32 and a column-major sgemm(T, N) with beta = 1, as
// matmul_cublas.cc does. A small tile budget makes 4 tiles of 2, 2, 2 and 1 rows.
TEST(CudaLaunchTest, MatMulGemmMappingMatchesReference) {
  std::mt19937 rng(9);
  for (bool accumulate : {false, true}) {
    MatMulParams p = SmallMatMul(accumulate, DType::kF16);
    std::vector<float> x = Random(p.num_rows * p.x_row_stride, rng);
    std::vector<uint16_t> w(p.out_features * p.in_features);
    std::vector<float> wf = Random(p.out_features * p.in_features, rng);
    for (size_t i = 0; i < w.size(); ++i) {
      w[i] = F32ToF16(wf[i]);
    }
    std::vector<float> bias = Random(p.out_features, rng);
    std::vector<float> y0 = Random(p.num_rows * p.y_row_stride, rng);
    std::vector<float> got = y0, want = y0;
    p.x = x.data();
    p.w = w.data();
    p.bias = bias.data();
    p.y = want.data();
    reference::MatMul(p);
    EmulateBiasInit(p, bias, &got);
    const int64_t tile_bytes = 2 * p.in_features * 4;
    const int64_t tile = MatMulTileRows(p, tile_bytes);
    ASSERT_EQ(tile, 2);
    std::vector<float> workspace(tile * p.in_features);
    std::vector<int> rows;
    for (int64_t first = 0; first < p.out_features; first += tile) {
      const GemmCall g = MatMulTile(p, first, tile_bytes);
      EXPECT_EQ(g.n, p.num_rows);
      EXPECT_EQ(g.k, p.in_features);
      ASSERT_LE(static_cast<int64_t>(g.m) * g.k, static_cast<int64_t>(workspace.size()));
      for (int64_t i = 0; i < static_cast<int64_t>(g.m) * g.k; ++i) {
        workspace[i] = F16ToF32(w[g.w_offset + i]);
      }
      HostSgemmTN(g.m, g.n, g.k, workspace.data(), g.lda, x.data(), g.ldb, 1.0f,
                  got.data() + g.y_offset, g.ldc);
      rows.push_back(g.m);
    }
    EXPECT_EQ(rows, (std::vector<int>{2, 2, 2, 1}));
    for (size_t i = 0; i < got.size(); ++i) {
      ASSERT_NEAR(got[i], want[i], 1e-5f) << i;  // padding columns untouched in both
    }
  }
}

// The native bf16 path emulated: bias step, x rounded to bf16 and packed (ldb = k), then one
// column-major gemm(T, N) of the bf16 weights as stored against it with f32 sums and beta = 1.
// It equals the reference MatMul run on x rounded to bf16: x's rounding is the only change.
TEST(CudaLaunchTest, MatMulNativeBf16MappingMatchesReferenceOnRoundedX) {
  std::mt19937 rng(10);
  for (bool accumulate : {false, true}) {
    MatMulParams p = SmallMatMul(accumulate, DType::kBF16);
    std::vector<float> x = Random(p.num_rows * p.x_row_stride, rng);
    std::vector<uint16_t> w(p.out_features * p.in_features);
    for (uint16_t& v : w) v = F32ToBf16(std::normal_distribution<float>()(rng));
    std::vector<float> bias = Random(p.out_features, rng);
    std::vector<float> y0 = Random(p.num_rows * p.y_row_stride, rng);
    std::vector<float> got = y0, want = y0;
    std::vector<float> x_rounded = x;
    for (float& v : x_rounded) v = Bf16ToF32(F32ToBf16(v));
    MatMulParams ref = p;
    ref.x = x_rounded.data();
    ref.w = w.data();
    ref.bias = bias.data();
    ref.y = want.data();
    reference::MatMul(ref);

    ASSERT_EQ(MatMulTileRows(p), p.out_features);
    ASSERT_EQ(MatMulWorkspaceBytes(p), p.num_rows * p.in_features * 2);
    EmulateBiasInit(p, bias, &got);
    // The packed bf16 x of the workspace (x rows are strided: one conversion per row).
    std::vector<uint16_t> xb(p.num_rows * p.in_features);
    for (int64_t r = 0; r < p.num_rows; ++r) {
      for (int64_t c = 0; c < p.in_features; ++c) {
        xb[r * p.in_features + c] = F32ToBf16(x[r * p.x_row_stride + c]);
      }
    }
    const GemmCall g = MatMulTile(p, 0);
    EXPECT_EQ(g.m, p.out_features);
    EXPECT_EQ(g.ldb, p.in_features);
    EXPECT_EQ(g.lda, p.in_features);
    EXPECT_EQ(g.ldc, p.y_row_stride);
    std::vector<float> wf(w.size()), xf(xb.size());
    for (size_t i = 0; i < w.size(); ++i) wf[i] = Bf16ToF32(w[i]);
    for (size_t i = 0; i < xb.size(); ++i) xf[i] = Bf16ToF32(xb[i]);
    HostSgemmTN(g.m, g.n, g.k, wf.data(), g.lda, xf.data(), g.ldb, 1.0f, got.data() + g.y_offset,
                g.ldc);
    for (size_t i = 0; i < got.size(); ++i) {
      ASSERT_NEAR(got[i], want[i], 1e-5f) << i;  // padding columns untouched in both
    }
  }
}

// A tile that does not divide out_features: the last GemmCall is the short remainder.
TEST(CudaLaunchTest, MatMulLastTileIsTheRemainder) {
  MatMulParams p;
  p.num_rows = 2;
  p.in_features = int64_t{3} << 20;  // 12 MiB per f32 row: tiles of 2 rows under 32 MiB
  p.out_features = 5;
  p.x_row_stride = p.in_features;
  p.y_row_stride = 8;
  p.w_dtype = DType::kF16;
  ASSERT_EQ(MatMulTileRows(p), 2);
  std::vector<int> rows;
  for (int64_t first = 0; first < p.out_features; first += MatMulTileRows(p)) {
    const GemmCall g = MatMulTile(p, first);
    EXPECT_EQ(g.y_offset, first);
    EXPECT_EQ(g.w_offset, first * p.in_features);
    EXPECT_EQ(g.lda, p.in_features);
    EXPECT_EQ(g.ldb, p.x_row_stride);
    EXPECT_EQ(g.ldc, 8);
    rows.push_back(g.m);
  }
  EXPECT_EQ(rows, (std::vector<int>{2, 2, 1}));
}

}  // namespace
}  // namespace pd::kernels::cuda
