// CPU-side tests of the CUDA AttentionMass (label unit, part of kernels_cuda_launch_test): an
// emulation of MassAddKernel on the host, every slot through the launch_config.h functions the
// .cu calls, given each row's (max, sum). With the CPU's sequential sums it must give the
// reference's bits (the per-slot order, the causal bound and the key addressing are the
// kernel's); with the sums reduced as MassStatsKernel's threads and warps do, within tolerance.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cuda/launch_config.h"
#include "kernels/reference/reference_ops.h"

namespace pd::kernels::cuda {
namespace {

struct Case {
  int64_t start_pos, num_tokens, num_heads, num_kv_heads, head_dim;
};

std::vector<float> Random(int64_t n, std::mt19937* rng) {
  std::uniform_real_distribution<float> u(-2.0f, 2.0f);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = u(*rng);
  return v;
}

// Each row's (max, sum of exp(score - max)): `sequential` as the CPU (keys ascending), else as
// MassStatsKernel: kMassThreads strided partial sums, warps by butterfly, warps in order.
std::vector<float> Stats(const AttentionMassParams& p, const KvCacheView& c, bool sequential) {
  std::vector<float> stats(
      static_cast<size_t>(AttentionMassWorkspaceFloats(p.num_tokens, p.num_heads)));
  const int64_t group = p.num_heads / p.num_kv_heads;
  const float scale = MassScale(p);
  for (int64_t j = 0; j < p.num_tokens; ++j) {
    for (int64_t h = 0; h < p.num_heads; ++h) {
      const int64_t keys = p.start_pos + j + 1, g = h / group;
      float max = -INFINITY;
      for (int64_t t = 0; t < keys; ++t) max = std::fmax(max, MassScore(p, c, j, h, t, g, scale));
      float sum = 0.0f;
      if (sequential) {
        for (int64_t t = 0; t < keys; ++t)
          sum += std::exp(MassScore(p, c, j, h, t, g, scale) - max);
      } else {
        std::vector<float> thread(kMassThreads, 0.0f);
        for (int64_t t = 0; t < keys; ++t) {
          thread[t % kMassThreads] += std::exp(MassScore(p, c, j, h, t, g, scale) - max);
        }
        for (int w = 0; w < kMassThreads / kWarpSize; ++w) {
          float* lanes = &thread[static_cast<size_t>(w * kWarpSize)];
          for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
            std::vector<float> next(lanes, lanes + kWarpSize);
            for (int l = 0; l < kWarpSize; ++l) next[l] = lanes[l] + lanes[l ^ offset];
            std::copy(next.begin(), next.end(), lanes);
          }
          sum += lanes[0];
        }
      }
      stats[static_cast<size_t>((j * p.num_heads + h) * 2)] = max;
      stats[static_cast<size_t>((j * p.num_heads + h) * 2 + 1)] = sum;
    }
  }
  return stats;
}

// MassAddKernel over its whole grid.
void EmulateAdd(const AttentionMassParams& p, const KvCacheView& c,
                const std::vector<float>& stats) {
  const int64_t keys = p.start_pos + p.num_tokens;
  for (int64_t g = 0; g < p.num_kv_heads; ++g) {
    for (int64_t b = 0; b < MassKeyTiles(keys); ++b) {
      for (int i = 0; i < kMassThreads; ++i) {
        const int64_t t = b * kMassThreads + i;
        if (t >= keys) continue;
        float* mass = p.mass + g * p.mass_head_stride + t;
        *mass = MassOfSlot(p, c, stats.data(), g, t, *mass);
      }
    }
  }
}

TEST(CudaAttentionMassLaunchTest, EmulatedKernelsGiveTheReferencesMass) {
  std::mt19937 rng(7);
  // GQA and MHA; one key tile and several; a chunk after cached keys and a decode step.
  for (const Case& s : {Case{0, 5, 4, 2, 16}, Case{300, 1, 8, 2, 64}, Case{250, 20, 6, 3, 40},
                        Case{0, 3, 2, 2, 13}}) {
    const int64_t keys = s.start_pos + s.num_tokens, row = s.num_kv_heads * s.head_dim;
    const std::vector<float> q = Random(s.num_tokens * s.num_heads * s.head_dim, &rng);
    const std::vector<float> k = Random(keys * row, &rng);
    // The same keys in an f32 paged cache: blocks of 16 in a shuffled table, layer 1 of 2.
    constexpr int64_t kBlockSize = 16, kLayers = 2;
    const int64_t blocks = (keys + kBlockSize - 1) / kBlockSize;
    std::vector<int32_t> table(static_cast<size_t>(blocks));
    for (int64_t b = 0; b < blocks; ++b) table[b] = static_cast<int32_t>((b * 7 + 3) % blocks);
    std::vector<float> pool(static_cast<size_t>(
        DenseKvBlockBytes(DType::kF32, kLayers, s.num_kv_heads, kBlockSize, s.head_dim) / 4 *
        blocks));
    const KvCacheView cache = DenseKvCacheView(pool.data(), DType::kF32, blocks, kLayers,
                                               s.num_kv_heads, kBlockSize, s.head_dim, 1);
    for (int64_t t = 0; t < keys; ++t) {
      for (int64_t g = 0; g < s.num_kv_heads; ++g) {
        std::memcpy(&pool[KvElementOffset(cache, table[t / kBlockSize], g, t, false)],
                    &k[t * row + g * s.head_dim], s.head_dim * sizeof(float));
      }
    }
    // And in an i4 cache through the reference WriteKv (its groups rotated, where head_dim
    // allows: MassScore reads such a key whole, ReadKvI4Row); i4 needs an even head_dim.
    const bool i4 = s.head_dim % 2 == 0;
    std::vector<uint8_t> i4_pool(static_cast<size_t>(
        DenseKvBlockBytes(DType::kI4, kLayers, s.num_kv_heads, kBlockSize, s.head_dim) * blocks));
    const KvCacheView i4_cache = DenseKvCacheView(i4_pool.data(), DType::kI4, blocks, kLayers,
                                                  s.num_kv_heads, kBlockSize, s.head_dim, 1);
    std::vector<int32_t> positions(static_cast<size_t>(keys));
    std::iota(positions.begin(), positions.end(), 0);
    WriteKvParams w;
    w.k = w.v = k.data();
    w.k_token_stride = w.v_token_stride = row;
    w.cache = i4_cache;
    w.num_tokens = keys;
    w.positions = positions.data();
    w.block_tables = table.data();
    w.max_blocks_per_seq = blocks;
    if (i4) reference::WriteKv(w);
    for (int mode = 0; mode < (i4 ? 3 : 2); ++mode) {  // f32 rows, the f32 cache, the i4 cache
      const bool from_cache = mode > 0;
      AttentionMassParams p;
      p.q = q.data();
      p.q_token_stride = s.num_heads * s.head_dim;
      if (from_cache) {
        p.cache = mode == 1 ? &cache : &i4_cache;
        p.block_table = table.data();
        p.num_table_blocks = blocks;
      } else {
        p.k = k.data();
        p.k_token_stride = row;
      }
      p.start_pos = s.start_pos;
      p.num_tokens = s.num_tokens;
      p.num_heads = s.num_heads;
      p.num_kv_heads = s.num_kv_heads;
      p.head_dim = s.head_dim;
      p.mass_head_stride = keys + 3;
      // A mass that already holds something (the earlier steps').
      const std::vector<float> before = Random(s.num_kv_heads * p.mass_head_stride, &rng);
      std::vector<float> want = before, got = before, near = before;
      p.mass = want.data();
      reference::AttentionMass(p);
      const KvCacheView c = from_cache ? *p.cache : KvCacheView{};
      p.mass = got.data();
      EmulateAdd(p, c, Stats(p, c, /*sequential=*/true));
      ASSERT_EQ(0, std::memcmp(got.data(), want.data(), want.size() * sizeof(float)))
          << "keys " << keys << ", mode " << mode;
      p.mass = near.data();
      EmulateAdd(p, c, Stats(p, c, /*sequential=*/false));
      for (size_t i = 0; i < want.size(); ++i) {
        ASSERT_NEAR(near[i], want[i], 1e-5f * (1.0f + std::fabs(want[i]))) << i;
      }
    }
  }
}

// Latent keys (an MLA cache: each key the whole entry, LatentEntryElement): the emulated
// kernels against the reference, bitwise with the CPU's sum order, for a bf16 and an i4 cache
// of 2 heads of 64 (a 256-element entry), 4 query heads, a chunk after cached keys.
TEST(CudaAttentionMassLaunchTest, LatentKeysGiveTheReferencesMass) {
  std::mt19937 rng(29);
  constexpr int64_t kHeads = 2, kDim = 64, kBlockSize = 16, kLayers = 2, kQueryHeads = 4;
  constexpr int64_t kStart = 270, kTokens = 3, kKeys = kStart + kTokens, kEntry = 2 * kHeads * kDim;
  const int64_t blocks = (kKeys + kBlockSize - 1) / kBlockSize;
  std::vector<int32_t> table(static_cast<size_t>(blocks));
  for (int64_t b = 0; b < blocks; ++b) table[b] = static_cast<int32_t>((b * 5 + 2) % blocks);
  std::vector<int32_t> positions(static_cast<size_t>(kKeys));
  std::iota(positions.begin(), positions.end(), 0);
  const std::vector<float> k = Random(kKeys * kHeads * kDim, &rng);
  const std::vector<float> v = Random(kKeys * kHeads * kDim, &rng);
  const std::vector<float> q = Random(kTokens * kQueryHeads * kEntry, &rng);
  for (DType dtype : {DType::kBF16, DType::kI4}) {
    std::vector<uint8_t> pool(
        static_cast<size_t>(DenseKvBlockBytes(dtype, kLayers, kHeads, kBlockSize, kDim) * blocks));
    const KvCacheView cache =
        DenseKvCacheView(pool.data(), dtype, blocks, kLayers, kHeads, kBlockSize, kDim, 1);
    ASSERT_EQ(LatentEntryDim(cache), kEntry);
    WriteKvParams w;
    w.k = k.data();
    w.v = v.data();
    w.k_token_stride = w.v_token_stride = kHeads * kDim;
    w.cache = cache;
    w.num_tokens = kKeys;
    w.positions = positions.data();
    w.block_tables = table.data();
    w.max_blocks_per_seq = blocks;
    reference::WriteKv(w);
    AttentionMassParams p;
    p.q = q.data();
    p.q_token_stride = kQueryHeads * kEntry;
    p.cache = &cache;
    p.block_table = table.data();
    p.num_table_blocks = blocks;
    p.latent = true;
    p.start_pos = kStart;
    p.num_tokens = kTokens;
    p.num_heads = kQueryHeads;
    p.num_kv_heads = 1;
    p.head_dim = kEntry;
    p.mass_head_stride = kKeys;
    std::vector<float> want(kKeys, 0.5f), got = want;
    p.mass = want.data();
    reference::AttentionMass(p);
    p.mass = got.data();
    EmulateAdd(p, cache, Stats(p, cache, /*sequential=*/true));
    EXPECT_EQ(0, std::memcmp(got.data(), want.data(), want.size() * sizeof(float)))
        << "dtype " << static_cast<int>(dtype);
  }
}

TEST(CudaAttentionMassLaunchTest, TilesCoverEveryKey) {
  EXPECT_EQ(MassKeyTiles(1), 1);
  EXPECT_EQ(MassKeyTiles(kMassThreads), 1);
  EXPECT_EQ(MassKeyTiles(kMassThreads + 1), 2);
  EXPECT_EQ(AttentionMassWorkspaceFloats(3, 8), 48);
}

}  // namespace
}  // namespace pd::kernels::cuda
