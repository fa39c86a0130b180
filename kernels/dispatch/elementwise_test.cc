#include "kernels/elementwise.h"

#include <cmath>
#include <cstdint>
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

SiluMulParams Params(const float* gate, const float* up, float* out, int64_t rows, int64_t dim,
                     int64_t stride) {
  SiluMulParams p;
  p.gate = gate;
  p.up = up;
  p.out = out;
  p.num_rows = rows;
  p.dim = dim;
  p.gate_row_stride = stride;
  p.up_row_stride = stride;
  p.out_row_stride = stride;
  return p;
}

// silu(0) = 0; silu(1) = 1 / (1 + e^-1) = 0.7310586; silu(-2) = -2 / (1 + e^2) = -0.2384058.
TEST(SiluMulReferenceTest, HandComputed) {
  const float gate[] = {0, 1, -2}, up[] = {5, 2, -1};
  float out[3];
  reference::SiluMul(Params(gate, up, out, 1, 3, 3));
  EXPECT_FLOAT_EQ(out[0], 0.0f);
  EXPECT_FLOAT_EQ(out[1], 2 * 0.7310586f);
  EXPECT_FLOAT_EQ(out[2], 0.2384058f);
}

// Random rows (gate and up as the halves of one fused [rows][2 * dim] buffer), including large
// |gate| where exp overflows. Tolerance: relative 1e-6 of the value scale (the vector exp is
// within 2e-7), NMSE 1e-12.
TEST(SiluMulCpuTest, MatchesReference) {
  std::mt19937 rng(3);
  for (const auto& variant : CpuVariants()) {
    VariantScope scope(variant);
    for (int64_t dim : {1, 7, 16, 33, 172, 8192}) {
      for (int64_t rows : {1, 3, 9}) {
        std::vector<float> fused = RandomVector(rows * 2 * dim, rng, 4.0f);
        fused[0] = 200.0f;                          // exp(-200) underflows
        fused[rows * 2 * dim - 1 - dim] = -200.0f;  // exp(200) overflows
        std::vector<float> got(rows * dim, -1), want(rows * dim, -1);
        SiluMulParams p = Params(fused.data(), fused.data() + dim, got.data(), rows, dim, 2 * dim);
        p.out_row_stride = dim;
        ASSERT_TRUE(SiluMul(scope.ctx(), p).ok());
        p.out = want.data();
        reference::SiluMul(p);
        const ErrorStats e = Compare(got.data(), want.data(), rows * dim);
        EXPECT_LE(e.max_abs, 2e-4) << variant.Name() << " dim " << dim;  // |out| up to ~800
        EXPECT_LE(e.nmse, 1e-12) << variant.Name() << " dim " << dim;
      }
    }
  }
}

TEST(SiluMulCpuTest, InPlaceOverGate) {
  std::mt19937 rng(4);
  std::vector<float> gate = RandomVector(100, rng), up = RandomVector(100, rng), want(100);
  reference::SiluMul(Params(gate.data(), up.data(), want.data(), 1, 100, 100));
  ASSERT_TRUE(SiluMul(OpContext{}, Params(gate.data(), up.data(), gate.data(), 1, 100, 100)).ok());
  EXPECT_LE(Compare(gate.data(), want.data(), 100).max_abs, 1e-6);
}

TEST(AddCpuTest, MatchesReferenceExactly) {
  std::mt19937 rng(5);
  for (const auto& variant : CpuVariants()) {
    VariantScope scope(variant);
    for (int64_t n : {1, 15, 16, 17, 100000}) {
      std::vector<float> a = RandomVector(n, rng), b = RandomVector(n, rng), got(n), want(n);
      ASSERT_TRUE(Add(scope.ctx(), AddParams{a.data(), b.data(), got.data(), n}).ok());
      reference::Add(AddParams{a.data(), b.data(), want.data(), n});
      EXPECT_EQ(got, want) << variant.Name();
      ASSERT_TRUE(Add(scope.ctx(), AddParams{a.data(), b.data(), a.data(), n}).ok());  // in place
      EXPECT_EQ(a, want);
    }
  }
}

TEST(ElementwiseDispatchTest, RejectsBadInput) {
  std::vector<float> buf(64);
  SiluMulParams p = Params(buf.data(), buf.data() + 16, buf.data() + 32, 1, 8, 8);
  EXPECT_TRUE(SiluMul(OpContext{}, p).ok());
  SiluMulParams bad = p;
  bad.out = buf.data() + 4;  // partly overlaps gate
  EXPECT_EQ(SiluMul(OpContext{}, bad).code(), absl::StatusCode::kInvalidArgument);
  bad = p;
  bad.up_row_stride = 4;
  EXPECT_EQ(SiluMul(OpContext{}, bad).code(), absl::StatusCode::kInvalidArgument);
  bad = p;
  bad.gate = nullptr;
  EXPECT_EQ(SiluMul(OpContext{}, bad).code(), absl::StatusCode::kInvalidArgument);
  // In place on a fused [rows][gate | up] buffer: out is gate, up sits in its rows' gaps
  // (CudaOpsTest.SiluMulAndAddMatchCpu's CPU reference call). Shifted by one float, up's rows
  // would overlap out's.
  std::mt19937 rng(9);
  std::vector<float> fused = RandomVector(4 * 16, rng), want(4 * 16, 0.0f);
  const std::vector<float> fused_before = fused;
  SiluMulParams inplace = Params(fused.data(), fused.data() + 8, fused.data(), 4, 8, 16);
  ASSERT_TRUE(SiluMul(OpContext{}, inplace).ok());
  reference::SiluMul(Params(fused_before.data(), fused_before.data() + 8, want.data(), 4, 8, 16));
  for (int64_t r = 0; r < 4; ++r) {
    for (int64_t c = 0; c < 8; ++c) {
      EXPECT_NEAR(fused[r * 16 + c], want[r * 16 + c], 1e-6f);
      EXPECT_EQ(fused[r * 16 + 8 + c], fused_before[r * 16 + 8 + c]);  // up untouched
    }
  }
  inplace.up = fused.data() + 7;
  EXPECT_EQ(SiluMul(OpContext{}, inplace).code(), absl::StatusCode::kInvalidArgument);
  inplace.up = fused.data() + 9;
  EXPECT_EQ(SiluMul(OpContext{}, inplace).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Add(OpContext{}, AddParams{buf.data(), buf.data() + 8, buf.data() + 4, 8}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Add(OpContext{}, AddParams{buf.data(), buf.data() + 8, buf.data() + 16, 0}).code(),
            absl::StatusCode::kInvalidArgument);
  if (!SupportsElementwise(Device::kCuda)) {
    EXPECT_EQ(SiluMul(OpContext{Device::kCuda, nullptr}, p).code(),
              absl::StatusCode::kUnimplemented);
  }
}

}  // namespace
}  // namespace pd::kernels
