// GPU tests of the tensor-core prefill (label gpu): PrefillAttention with tensor_cores on a
// bf16 cache against the CPU op, within the bf16 rounding of Q and P
// (kernels/cuda/prefill_tc.h). Skip without a CUDA device.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/attention.h"
#include "kernels/cuda/cuda_test_util.h"
#include "kernels/half.h"

namespace pd::kernels {
namespace {

using cuda::testing::CudaCtx;
using cuda::testing::DeviceBuffer;

TEST(CudaPrefillTcTest, MatchesCpuWithinBf16Rounding) {
  PD_SKIP_WITHOUT_GPU();
  std::mt19937 rng(51);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  struct Case {
    int64_t kv_heads, heads, head_dim, start_pos, num_tokens;
  };
  for (const Case& k : {Case{2, 8, 64, 0, 37}, Case{2, 8, 64, 13, 300}, Case{1, 4, 128, 64, 64},
                        Case{8, 32, 64, 0, 512}, Case{4, 4, 16, 200, 3}}) {
    const int64_t block_size = 16, len = k.start_pos + k.num_tokens;
    const int64_t blocks = (len + block_size - 1) / block_size;
    KvCacheView view =
        DenseKvCacheView(nullptr, DType::kBF16, blocks, 2, k.kv_heads, block_size, k.head_dim, 1);
    std::vector<uint16_t> pool(blocks * view.block_stride);
    for (uint16_t& x : pool) {
      x = F32ToBf16(dist(rng));
    }
    std::vector<int32_t> table(blocks);
    std::iota(table.begin(), table.end(), 0);
    std::shuffle(table.begin(), table.end(), rng);
    const int64_t row = k.heads * k.head_dim;
    std::vector<float> q(k.num_tokens * row);
    for (float& x : q) {
      x = dist(rng);
    }
    PrefillAttentionParams p;
    p.q_token_stride = row;
    p.out_token_stride = row;
    p.num_table_blocks = blocks;
    p.start_pos = k.start_pos;
    p.num_tokens = k.num_tokens;
    p.num_heads = k.heads;
    std::vector<float> want(k.num_tokens * row);
    PrefillAttentionParams cpu = p;
    cpu.q = q.data();
    cpu.out = want.data();
    cpu.cache = view;
    cpu.cache.base = pool.data();
    cpu.block_table = table.data();
    ASSERT_TRUE(PrefillAttention(OpContext{}, cpu).ok());
    DeviceBuffer dpool(pool), dq(q), dout(want.size() * sizeof(float)), dtab(table);
    PrefillAttentionParams gpu = p;
    gpu.q = dq.as<float>();
    gpu.out = dout.as<float>();
    gpu.cache = view;
    gpu.cache.base = dpool.get();
    gpu.block_table = dtab.as<int32_t>();
    gpu.tensor_cores = true;
    ASSERT_TRUE(PrefillAttention(CudaCtx(), gpu).ok());
    const std::vector<float> got = dout.Download<float>();
    double max_err = 0.0;
    for (size_t i = 0; i < got.size(); ++i) {
      ASSERT_FALSE(std::isnan(got[i])) << i;
      max_err = std::max(max_err, static_cast<double>(std::fabs(got[i] - want[i])));
    }
    EXPECT_LT(max_err, 2e-2) << "head_dim " << k.head_dim << " tokens " << k.num_tokens;
  }
}

}  // namespace
}  // namespace pd::kernels
