// CPU-side tests of the CUDA AttentionMass (label unit, part of kernels_cuda_launch_test): an
// emulation of MassAddKernel on the host, every slot through the launch_config.h functions the
// .cu calls, given each row's (max, sum). With the CPU's sequential sums it must give the
// reference's bits (the per-slot order, the causal bound and the key addressing are the
// kernel's); with the sums reduced as MassStatsKernel's threads and warps do, within tolerance.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
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
    for (bool from_cache : {false, true}) {
      AttentionMassParams p;
      p.q = q.data();
      p.q_token_stride = s.num_heads * s.head_dim;
      if (from_cache) {
        p.cache = &cache;
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
      const KvCacheView c = from_cache ? cache : KvCacheView{};
      p.mass = got.data();
      EmulateAdd(p, c, Stats(p, c, /*sequential=*/true));
      ASSERT_EQ(0, std::memcmp(got.data(), want.data(), want.size() * sizeof(float)))
          << "keys " << keys << (from_cache ? ", from the cache" : ", f32 rows");
      p.mass = near.data();
      EmulateAdd(p, c, Stats(p, c, /*sequential=*/false));
      for (size_t i = 0; i < want.size(); ++i) {
        ASSERT_NEAR(near[i], want[i], 1e-5f * (1.0f + std::fabs(want[i]))) << i;
      }
    }
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
