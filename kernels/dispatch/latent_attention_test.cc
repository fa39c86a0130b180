// LatentAttention: the CPU kernel against the reference (every cache dtype, every ISA variant,
// split and unsplit entries), batch invariance (a token's output is bitwise the same alone, in
// a prefill chunk or beside other sequences, on any thread count), a hand-checked case and
// dispatch's errors.
#include "kernels/latent_attention.h"

#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/attention.h"
#include "kernels/dispatch/kernel_test_util.h"
#include "kernels/dispatch/latent_attention_test_util.h"
#include "kernels/reference/reference_ops.h"
#include "kernels/type_names.h"

namespace pd::kernels {
namespace {

using testing::Compare;
using testing::CpuVariants;
using testing::kLatentGeometries;
using testing::LatentGeometry;
using testing::LatentParams;
using testing::LatentPool;
using testing::LatentQueries;
using testing::MakeLatentPool;
using testing::MakeLatentQueries;
using testing::RandomVector;
using testing::VariantScope;

TEST(LatentAttentionTest, CpuMatchesTheReferenceForEveryCacheDtype) {
  std::mt19937 rng(5);
  for (const LatentGeometry& g : kLatentGeometries) {
    for (DType dtype :
         {DType::kF32, DType::kBF16, DType::kF16, DType::kI8, DType::kF8E4M3, DType::kI4}) {
      const LatentPool pool =
          MakeLatentPool(dtype, g.pieces_per_half, g.head_dim, g.block_size, rng);
      const LatentQueries qs = MakeLatentQueries(pool, g.heads, rng);
      std::vector<float> want;
      LatentAttentionParams r = LatentParams(pool, qs, g.heads, g.value_dim, &want);
      reference::LatentAttention(r);
      for (const auto& variant : CpuVariants()) {
        VariantScope scope(variant);
        std::vector<float> got;
        LatentAttentionParams p = LatentParams(pool, qs, g.heads, g.value_dim, &got);
        ASSERT_TRUE(LatentAttention(scope.ctx(), p).ok());
        const std::string where = variant.Name() + " " + std::string(DTypeName(dtype)) +
                                  " head_dim " + std::to_string(g.head_dim);
        for (int64_t j = 0; j < p.num_tokens; ++j) {
          const int64_t row = j * p.out_token_stride;
          const auto e = Compare(got.data() + row, want.data() + row, g.heads * g.value_dim);
          EXPECT_LE(e.max_abs, 2e-5) << where << " token " << j;
          // The padding after a token's heads is never written.
          EXPECT_EQ(got[static_cast<size_t>(row + g.heads * g.value_dim)], -7.0f) << where;
        }
      }
    }
  }
}

// Batch invariance: every token alone (a decode step) gives the bits it got in the batch, on
// every variant; variants of one ISA agree with each other whatever their thread count.
TEST(LatentAttentionTest, ATokensOutputDoesNotDependOnItsBatch) {
  std::mt19937 rng(9);
  for (const LatentGeometry& g : kLatentGeometries) {
    const LatentPool pool =
        MakeLatentPool(DType::kBF16, g.pieces_per_half, g.head_dim, g.block_size, rng);
    const LatentQueries qs = MakeLatentQueries(pool, g.heads, rng);
    std::vector<std::vector<float>> by_isa;
    for (const auto& variant : CpuVariants()) {
      VariantScope scope(variant);
      std::vector<float> batched;
      LatentAttentionParams p = LatentParams(pool, qs, g.heads, g.value_dim, &batched);
      ASSERT_TRUE(LatentAttention(scope.ctx(), p).ok());
      for (int64_t j = 0; j < p.num_tokens; ++j) {
        std::vector<float> alone(static_cast<size_t>(p.out_token_stride), -7.0f);
        LatentAttentionParams one = p;
        one.q = p.q + j * p.q_token_stride;
        one.out = alone.data();
        one.num_tokens = 1;
        one.positions = p.positions + j;
        one.token_seq = p.token_seq + j;
        ASSERT_TRUE(LatentAttention(scope.ctx(), one).ok());
        EXPECT_EQ(0, std::memcmp(alone.data(), batched.data() + j * p.out_token_stride,
                                 static_cast<size_t>(g.heads * g.value_dim) * sizeof(float)))
            << variant.Name() << " head_dim " << g.head_dim << " token " << j;
      }
      if (variant.threads == 1) {
        by_isa.push_back(batched);
      } else {
        EXPECT_EQ(batched, by_isa.back()) << variant.Name() << " against one thread";
      }
    }
  }
}

// One key: the softmax is 1, so every head returns the entry's leading value_dim elements
// exactly; two equal keys return it too.
TEST(LatentAttentionTest, OneKeyReturnsItsLatent) {
  std::mt19937 rng(3);
  const LatentPool pool = MakeLatentPool(DType::kF32, 2, 64, 4, rng);
  LatentQueries qs;
  qs.positions = {0};
  qs.seqs = {1};
  qs.q = RandomVector(4 * pool.entry() + 2, rng);
  std::vector<float> out;
  const LatentAttentionParams p = LatentParams(pool, qs, 4, 200, &out);
  ASSERT_TRUE(LatentAttention(OpContext{}, p).ok());
  const float* latent = pool.entries.data() + pool.max_keys() * pool.entry();  // seq 1, key 0
  for (int64_t h = 0; h < 4; ++h) {
    EXPECT_EQ(0, std::memcmp(out.data() + h * 200, latent, 200 * sizeof(float))) << "head " << h;
  }
}

TEST(LatentAttentionTest, RejectsBadInput) {
  std::mt19937 rng(4);
  const LatentPool pool = MakeLatentPool(DType::kF32, 1, 16, 4, rng);
  LatentQueries qs = MakeLatentQueries(pool, 2, rng);
  std::vector<float> out;
  const LatentAttentionParams good = LatentParams(pool, qs, 2, 16, &out);
  ASSERT_TRUE(LatentAttention(OpContext{}, good).ok());
  auto expect = [&](LatentAttentionParams p, absl::StatusCode code, const std::string& part) {
    const absl::Status s = LatentAttention(OpContext{}, p);
    EXPECT_EQ(s.code(), code) << s;
    EXPECT_NE(std::string(s.message()).find(part), std::string::npos) << s;
  };
  LatentAttentionParams p = good;
  p.q = nullptr;
  expect(p, absl::StatusCode::kInvalidArgument, "null q");
  p = good;
  p.value_dim = 33;
  expect(p, absl::StatusCode::kInvalidArgument, "value_dim 33 outside (0, 32]");
  p = good;
  p.value_dim = 0;
  expect(p, absl::StatusCode::kInvalidArgument, "value_dim 0");
  p = good;
  p.num_heads = 0;
  expect(p, absl::StatusCode::kInvalidArgument, "must be > 0");
  p = good;
  p.q_token_stride = 2 * 32 - 1;
  expect(p, absl::StatusCode::kInvalidArgument, "strides");
  p = good;
  p.out = const_cast<float*>(p.q) + 1;
  expect(p, absl::StatusCode::kInvalidArgument, "overlap");
  p = good;
  p.num_seqs = 1;
  expect(p, absl::StatusCode::kInvalidArgument, "sequence 1 outside [0, 1)");
  p = good;
  qs.positions[3] = static_cast<int32_t>(LatentPool::kTableBlocks * 4);
  expect(p, absl::StatusCode::kInvalidArgument, "outside the block table");
  qs.positions[3] = 8;
  std::vector<int32_t> bad_tables = pool.tables;
  bad_tables[2] = LatentPool::kBlocks;  // sequence 0's third block: read by position 8 and on
  p = good;
  p.block_tables = bad_tables.data();
  expect(p, absl::StatusCode::kInvalidArgument, "block");
  p = good;
  p.cache.head_dim = 300;
  expect(p, absl::StatusCode::kInvalidArgument, "");
  p = good;
  p.cache.num_kv_heads = 40;
  p.cache.kv_stride = 40 * p.cache.head_stride;
  p.cache.layer_stride = 2 * p.cache.kv_stride;
  p.cache.block_stride = 2 * p.cache.layer_stride;
  expect(p, absl::StatusCode::kInvalidArgument, "above the 1024 supported");
  // Without a CUDA build nothing runs on kCuda: refused before any pointer is touched. (The
  // CUDA kernel itself, i4 caches included: kernels_cuda_test, label gpu.)
  if (!SupportsAttention(Device::kCuda, DType::kI4)) {
    const LatentPool i4 = MakeLatentPool(DType::kI4, 1, 16, 4, rng);
    std::vector<float> i4_out;
    OpContext cuda;
    cuda.device = Device::kCuda;
    const absl::Status s = LatentAttention(cuda, LatentParams(i4, qs, 2, 16, &i4_out));
    EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented) << s;
    EXPECT_NE(std::string(s.message()).find("cuda"), std::string::npos) << s;
  }
}

}  // namespace
}  // namespace pd::kernels
