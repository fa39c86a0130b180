// AttentionMass: the CPU kernel against the reference (bitwise), the mass a query hands out
// (one per query head), chunked calls against one call, and dispatch's errors.
#include "kernels/attention_mass.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/dispatch/kernel_test_util.h"
#include "kernels/reference/reference_ops.h"

namespace pd::kernels {
namespace {

using testing::CpuVariants;
using testing::RandomVector;
using testing::VariantScope;

struct Shape {
  int64_t start_pos, num_tokens, num_heads, num_kv_heads, head_dim;
};

AttentionMassParams Params(const Shape& s, const std::vector<float>& q, const std::vector<float>& k,
                           std::vector<float>* mass) {
  AttentionMassParams p;
  p.q = q.data();
  p.q_token_stride = s.num_heads * s.head_dim + 3;  // padded rows
  p.k = k.data();
  p.k_token_stride = s.num_kv_heads * s.head_dim + 1;
  p.start_pos = s.start_pos;
  p.num_tokens = s.num_tokens;
  p.num_heads = s.num_heads;
  p.num_kv_heads = s.num_kv_heads;
  p.head_dim = s.head_dim;
  p.mass_head_stride = s.start_pos + s.num_tokens + 5;
  mass->assign(static_cast<size_t>(s.num_kv_heads * p.mass_head_stride), 0.0f);
  p.mass = mass->data();
  return p;
}

TEST(AttentionMassTest, CpuMatchesTheReferenceBitwiseAndHandsOutOnePerQueryHead) {
  std::mt19937 rng(7);
  for (const Shape& s : {Shape{0, 1, 1, 1, 8}, Shape{0, 37, 4, 2, 16}, Shape{20, 1, 8, 2, 64},
                         Shape{100, 9, 6, 3, 32}}) {
    const std::vector<float> q =
        RandomVector(s.num_tokens * (s.num_heads * s.head_dim + 3), rng, 2.0f);
    const std::vector<float> k =
        RandomVector((s.start_pos + s.num_tokens) * (s.num_kv_heads * s.head_dim + 1), rng, 2.0f);
    std::vector<float> want;
    AttentionMassParams r = Params(s, q, k, &want);
    reference::AttentionMass(r);
    for (const auto& variant : CpuVariants()) {
      VariantScope scope(variant);
      std::vector<float> got;
      AttentionMassParams p = Params(s, q, k, &got);
      ASSERT_TRUE(AttentionMass(scope.ctx(), p).ok());
      ASSERT_EQ(0, std::memcmp(got.data(), want.data(), got.size() * sizeof(float)))
          << variant.Name() << " start " << s.start_pos << " tokens " << s.num_tokens;
    }
    // Each query head hands out a mass of one, to keys at or before its position only.
    const int64_t group = s.num_heads / s.num_kv_heads;
    for (int64_t g = 0; g < s.num_kv_heads; ++g) {
      double total = 0;
      for (int64_t t = 0; t < r.mass_head_stride; ++t) {
        const float m = want[g * r.mass_head_stride + t];
        if (t >= s.start_pos + s.num_tokens) {
          EXPECT_EQ(m, 0.0f);
        }
        EXPECT_GE(m, 0.0f);
        total += m;
      }
      EXPECT_NEAR(total, static_cast<double>(s.num_tokens * group), 1e-4 * s.num_tokens * group);
    }
  }
}

// Decode adds one query at a time: the same floats in the same order as one call for all.
TEST(AttentionMassTest, QueriesSplitOverCallsAddTheSameBits) {
  std::mt19937 rng(11);
  const Shape whole{3, 12, 4, 2, 16};
  const std::vector<float> q = RandomVector(whole.num_tokens * (4 * 16 + 3), rng);
  const std::vector<float> k = RandomVector((3 + 12) * (2 * 16 + 1), rng);
  std::vector<float> once;
  AttentionMassParams p = Params(whole, q, k, &once);
  const OpContext ctx;
  ASSERT_TRUE(AttentionMass(ctx, p).ok());
  std::vector<float> split;
  AttentionMassParams c = Params(whole, q, k, &split);
  for (int64_t j = 0; j < whole.num_tokens; ++j) {
    c.q = q.data() + j * c.q_token_stride;
    c.start_pos = whole.start_pos + j;
    c.num_tokens = 1;
    ASSERT_TRUE(AttentionMass(ctx, c).ok());
  }
  EXPECT_EQ(0, std::memcmp(once.data(), split.data(), once.size() * sizeof(float)));
}

TEST(AttentionMassTest, BadParametersAndOtherDevicesAreRefused) {
  std::vector<float> q(64), k(64), mass;
  const Shape s{0, 2, 2, 1, 8};
  const OpContext cpu;
  AttentionMassParams p = Params(s, q, k, &mass);
  AttentionMassParams bad = p;
  bad.mass = nullptr;
  EXPECT_EQ(AttentionMass(cpu, bad).code(), absl::StatusCode::kInvalidArgument);
  bad = p;
  bad.num_heads = 3;
  EXPECT_EQ(AttentionMass(cpu, bad).code(), absl::StatusCode::kInvalidArgument);
  bad = p;
  bad.mass_head_stride = 1;
  EXPECT_NE(AttentionMass(cpu, bad).message().find("mass_head_stride"), absl::string_view::npos);
  bad = p;
  bad.q_token_stride = 4;
  EXPECT_EQ(AttentionMass(cpu, bad).code(), absl::StatusCode::kInvalidArgument);
  OpContext cuda;
  cuda.device = Device::kCuda;
  EXPECT_EQ(AttentionMass(cuda, p).code(), absl::StatusCode::kUnimplemented);
}

}  // namespace
}  // namespace pd::kernels
