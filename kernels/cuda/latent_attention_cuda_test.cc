// GPU test of the CUDA LatentAttention (MLA, absorbed; label gpu): the kernel against the
// double reference on the CPU test's fixtures (every cache dtype CUDA reads, the entry
// geometries of real MLA models, a prefill chunk beside decode tokens of two sequences in
// scattered blocks). Skips without a CUDA device.
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cuda/cuda_test_util.h"
#include "kernels/dispatch/kernel_test_util.h"
#include "kernels/dispatch/latent_attention_test_util.h"
#include "kernels/latent_attention.h"
#include "kernels/reference/reference_ops.h"
#include "kernels/type_names.h"

namespace pd::kernels {
namespace {

using cuda::testing::CudaCtx;
using cuda::testing::DeviceBuffer;
using testing::Compare;
using testing::kLatentGeometries;
using testing::LatentGeometry;
using testing::LatentParams;
using testing::LatentPool;
using testing::LatentQueries;
using testing::MakeLatentPool;
using testing::MakeLatentQueries;

// The kernel sums a key's score over 32 lanes and its keys over 4 warps (the reference: in
// order, in double); the CPU kernel is within 2e-5 of the reference on these inputs, and a
// wrong key or weight moves outputs by 1e-3 or more.
constexpr double kMaxAbs = 3e-5;

TEST(CudaLatentAttentionTest, MatchesTheReferenceForEveryCacheDtype) {
  PD_SKIP_WITHOUT_GPU();
  std::mt19937 rng(5);
  for (const LatentGeometry& g : kLatentGeometries) {
    for (DType dtype :
         {DType::kF32, DType::kBF16, DType::kF16, DType::kI8, DType::kF8E4M3, DType::kI4}) {
      const LatentPool pool =
          MakeLatentPool(dtype, g.pieces_per_half, g.head_dim, g.block_size, rng);
      const LatentQueries qs = MakeLatentQueries(pool, g.heads, rng);
      std::vector<float> want;
      LatentAttentionParams p = LatentParams(pool, qs, g.heads, g.value_dim, &want);
      reference::LatentAttention(p);
      // The same inputs on the device; out starts as the host's untouched -7s.
      DeviceBuffer d_pool(pool.storage), d_q(qs.q), d_positions(qs.positions), d_seqs(qs.seqs),
          d_tables(pool.tables);
      std::vector<float> init;
      LatentParams(pool, qs, g.heads, g.value_dim, &init);
      DeviceBuffer d_out(init);
      p.cache.base = d_pool.get();
      p.q = d_q.as<float>();
      p.out = d_out.as<float>();
      p.positions = d_positions.as<int32_t>();
      p.token_seq = d_seqs.as<int32_t>();
      p.block_tables = d_tables.as<int32_t>();
      ASSERT_TRUE(LatentAttention(CudaCtx(), p).ok());
      const std::vector<float> got = d_out.Download<float>();
      const std::string where =
          std::string(DTypeName(dtype)) + " head_dim " + std::to_string(g.head_dim);
      for (int64_t j = 0; j < p.num_tokens; ++j) {
        const int64_t row = j * p.out_token_stride;
        const auto e = Compare(got.data() + row, want.data() + row, g.heads * g.value_dim);
        EXPECT_LE(e.max_abs, kMaxAbs) << where << " token " << j;
        EXPECT_EQ(got[static_cast<size_t>(row + g.heads * g.value_dim)], -7.0f) << where;
      }
    }
  }
}

}  // namespace
}  // namespace pd::kernels
