#include "kernels/rope.h"

#include <cmath>
#include <cstdint>
#include <numbers>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/dispatch/kernel_test_util.h"
#include "kernels/reference/reference_ops.h"

namespace pd::kernels {
namespace {

using testing::Compare;
using testing::CpuVariants;
using testing::ErrorStats;
using testing::RandomVector;
using testing::VariantScope;

constexpr float kPi = std::numbers::pi_v<float>;

RopeParams OneToken(float* q, const int32_t* pos, const float* inv_freq, int64_t head_dim,
                    RopeStyle style) {
  RopeParams p;
  p.q = q;
  p.positions = pos;
  p.inv_freq = inv_freq;
  p.num_tokens = 1;
  p.num_heads = 1;
  p.num_kv_heads = 0;
  p.head_dim = head_dim;
  p.q_token_stride = head_dim;
  p.style = style;
  return p;
}

// Hand-computed quarter and half turns: interleaved rotates (x0, x1) and (x2, x3); rotate-half
// rotates (x0, x2) and (x1, x3).
TEST(RopeReferenceTest, HandComputed) {
  const float inv_freq[] = {kPi / 2, kPi};
  const int32_t pos[] = {1};
  float q[] = {1, 2, 3, 4};
  reference::Rope(OneToken(q, pos, inv_freq, 4, RopeStyle::kInterleaved));
  const float want_interleaved[] = {-2, 1, -3, -4};
  for (int i = 0; i < 4; ++i) {
    EXPECT_NEAR(q[i], want_interleaved[i], 1e-6) << i;
  }
  float r[] = {1, 2, 3, 4};
  reference::Rope(OneToken(r, pos, inv_freq, 4, RopeStyle::kRotateHalf));
  const float want_half[] = {-3, -2, 1, -4};
  for (int i = 0; i < 4; ++i) {
    EXPECT_NEAR(r[i], want_half[i], 1e-6) << i;
  }
}

TEST(RopeInvFreqTest, PlainTheta) {
  auto inv = ComputeRopeInvFreq({8, 10000.0, {}});
  ASSERT_TRUE(inv.ok()) << inv.status();
  ASSERT_EQ(inv->size(), 4u);
  EXPECT_FLOAT_EQ((*inv)[0], 1.0f);
  EXPECT_FLOAT_EQ((*inv)[1], 0.1f);
  EXPECT_FLOAT_EQ((*inv)[2], 0.01f);
  EXPECT_FLOAT_EQ((*inv)[3], 0.001f);
}

// Llama 3.1 config (theta 5e5, head_dim 128, factor 8, low 1, high 4, original 8192): short
// wavelengths (< 2048) unchanged, long ones (> 8192) divided by 8, the band between blended.
TEST(RopeInvFreqTest, Llama3Scaling) {
  RopeFreqConfig config{128, 500000.0, {}};
  auto plain = ComputeRopeInvFreq(config);
  config.llama3.enabled = true;
  auto scaled = ComputeRopeInvFreq(config);
  ASSERT_TRUE(plain.ok() && scaled.ok());
  int unchanged = 0, divided = 0, blended = 0;
  for (int i = 0; i < 64; ++i) {
    const double f = (*plain)[i];
    const double wavelen = 2 * std::numbers::pi / f;
    if (wavelen < 2048) {
      EXPECT_FLOAT_EQ((*scaled)[i], (*plain)[i]) << i;
      ++unchanged;
    } else if (wavelen > 8192) {
      EXPECT_FLOAT_EQ((*scaled)[i], static_cast<float>(f / 8)) << i;
      ++divided;
    } else {
      const double s = (8192 / wavelen - 1) / (4 - 1);
      EXPECT_FLOAT_EQ((*scaled)[i], static_cast<float>((1 - s) * f / 8 + s * f)) << i;
      EXPECT_LT((*scaled)[i], (*plain)[i]);
      EXPECT_GT((*scaled)[i], (*plain)[i] / 8);
      ++blended;
    }
  }
  EXPECT_GT(unchanged, 0);
  EXPECT_GT(divided, 0);
  EXPECT_GT(blended, 0);
  // A hand-checked element: i = 0 has f = 1 (wavelength 2 pi), untouched.
  EXPECT_EQ((*scaled)[0], 1.0f);
}

TEST(RopeInvFreqTest, RejectsBadConfig) {
  EXPECT_FALSE(ComputeRopeInvFreq({7, 10000.0, {}}).ok());
  EXPECT_FALSE(ComputeRopeInvFreq({0, 10000.0, {}}).ok());
  EXPECT_FALSE(ComputeRopeInvFreq({8, 1.0, {}}).ok());
  RopeFreqConfig c{8, 10000.0, {}};
  c.llama3.enabled = true;
  c.llama3.high_freq_factor = 1.0;  // == low
  EXPECT_FALSE(ComputeRopeInvFreq(c).ok());
}

// Same numbers as llama2.c's run.c (interleaved, f32 angle) for positions where f32 angles are
// still exact enough: the stories260K shape (head_dim 8, 8 heads, 4 kv heads).
TEST(RopeCpuTest, MatchesLlama2c) {
  const int64_t head_dim = 8, heads = 8, kv_heads = 4;
  auto inv = ComputeRopeInvFreq({head_dim, 10000.0, {}});
  ASSERT_TRUE(inv.ok());
  std::mt19937 rng(1);
  for (int32_t pos : {0, 1, 7, 100, 511}) {
    std::vector<float> q = RandomVector(heads * head_dim, rng);
    std::vector<float> k = RandomVector(kv_heads * head_dim, rng);
    std::vector<float> want_q = q, want_k = k;
    // run.c: for i even, head_dim = i % head_size, freq = 1 / 10000^(head_dim / head_size).
    for (int64_t i = 0; i < heads * head_dim; i += 2) {
      const float freq = 1.0f / std::pow(10000.0f, static_cast<float>(i % head_dim) / head_dim);
      const float val = pos * freq, fcr = std::cos(val), fci = std::sin(val);
      for (int v = 0; v < (i < kv_heads * head_dim ? 2 : 1); ++v) {
        float* vec = v == 0 ? want_q.data() : want_k.data();
        const float v0 = vec[i], v1 = vec[i + 1];
        vec[i] = v0 * fcr - v1 * fci;
        vec[i + 1] = v0 * fci + v1 * fcr;
      }
    }
    RopeParams p = OneToken(q.data(), &pos, inv->data(), head_dim, RopeStyle::kInterleaved);
    p.num_heads = heads;
    p.num_kv_heads = kv_heads;
    p.q_token_stride = heads * head_dim;
    p.k = k.data();
    p.k_token_stride = kv_heads * head_dim;
    ASSERT_TRUE(Rope(OpContext{}, p).ok());
    EXPECT_LE(Compare(q.data(), want_q.data(), heads * head_dim).max_abs, 2e-5) << pos;
    EXPECT_LE(Compare(k.data(), want_k.data(), kv_heads * head_dim).max_abs, 2e-5) << pos;
  }
}

// Random shapes and positions (up to 500k, where an f32 angle would be off by ~0.03 rad),
// q and k inside one fused [token][q | k | v] buffer. Tolerance: max-abs 2e-6 for N(0, 1)
// inputs, NMSE 1e-12 (f32 rounding of cos/sin and of the products).
TEST(RopeCpuTest, MatchesReference) {
  std::mt19937 rng(2);
  std::uniform_int_distribution<int32_t> pos_dist(0, 500000);
  struct Shape {
    int64_t tokens, heads, kv_heads, head_dim;
  };
  for (const auto& variant : CpuVariants()) {
    VariantScope scope(variant);
    for (RopeStyle style : {RopeStyle::kInterleaved, RopeStyle::kRotateHalf}) {
      for (const Shape& s : {Shape{1, 1, 1, 2}, Shape{3, 8, 4, 8}, Shape{5, 4, 1, 64},
                             Shape{70, 8, 2, 128}, Shape{2, 3, 3, 6}}) {
        auto inv = ComputeRopeInvFreq({s.head_dim, 500000.0, {}});
        ASSERT_TRUE(inv.ok());
        const int64_t stride = (s.heads + 2 * s.kv_heads) * s.head_dim;
        std::vector<float> qkv = RandomVector(s.tokens * stride, rng);
        std::vector<int32_t> pos(s.tokens);
        for (int32_t& x : pos) {
          x = pos_dist(rng);
        }
        std::vector<float> want = qkv;
        RopeParams p;
        p.q = qkv.data();
        p.k = qkv.data() + s.heads * s.head_dim;
        p.positions = pos.data();
        p.inv_freq = inv->data();
        p.num_tokens = s.tokens;
        p.num_heads = s.heads;
        p.num_kv_heads = s.kv_heads;
        p.head_dim = s.head_dim;
        p.q_token_stride = stride;
        p.k_token_stride = stride;
        p.style = style;
        ASSERT_TRUE(Rope(scope.ctx(), p).ok());
        p.q = want.data();
        p.k = want.data() + s.heads * s.head_dim;
        reference::Rope(p);
        const ErrorStats e = Compare(qkv.data(), want.data(), s.tokens * stride);
        EXPECT_LE(e.max_abs, 2e-6) << variant.Name() << " head_dim " << s.head_dim;
        EXPECT_LE(e.nmse, 1e-12) << variant.Name() << " head_dim " << s.head_dim;
      }
    }
  }
}

TEST(RopeDispatchTest, RejectsBadInput) {
  std::vector<float> q(64), k(64), inv(4);
  int32_t pos = 3;
  RopeParams p = OneToken(q.data(), &pos, inv.data(), 8, RopeStyle::kRotateHalf);
  EXPECT_TRUE(Rope(OpContext{}, p).ok());
  RopeParams bad = p;
  bad.head_dim = 7;
  bad.q_token_stride = 7;
  EXPECT_EQ(Rope(OpContext{}, bad).code(), absl::StatusCode::kInvalidArgument);
  bad = p;
  bad.q_token_stride = 4;
  EXPECT_EQ(Rope(OpContext{}, bad).code(), absl::StatusCode::kInvalidArgument);
  bad = p;
  bad.num_kv_heads = 1;  // k still null
  EXPECT_EQ(Rope(OpContext{}, bad).code(), absl::StatusCode::kInvalidArgument);
  int32_t negative = -1;
  bad = p;
  bad.positions = &negative;
  EXPECT_EQ(Rope(OpContext{}, bad).code(), absl::StatusCode::kInvalidArgument);
  if (!SupportsRope(Device::kCuda)) {
    EXPECT_EQ(Rope(OpContext{Device::kCuda, nullptr}, p).code(), absl::StatusCode::kUnimplemented);
  }
}

}  // namespace
}  // namespace pd::kernels
