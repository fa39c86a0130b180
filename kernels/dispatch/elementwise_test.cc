#include "kernels/elementwise.h"

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
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

ScaledScatterAddParams Scatter(const std::vector<float>& in, const std::vector<int32_t>& rows,
                               const std::vector<float>& weights, std::vector<float>* out,
                               int64_t dim, int64_t out_rows) {
  ScaledScatterAddParams p;
  p.in = in.data();
  p.rows = rows.data();
  p.weights = weights.data();
  p.out = out->data();
  p.num_rows = static_cast<int64_t>(rows.size());
  p.dim = dim;
  p.out_rows = out_rows;
  p.in_row_stride = dim;
  p.out_row_stride = dim + 3;  // rows apart: the strides are honoured
  return p;
}

// Experts in turn, each adding its weighted rows into the tokens routed to it: bitwise the
// reference's (the product rounded, then the sum), for every CPU variant, and rows not routed
// to stay as they were.
TEST(ScaledScatterAddCpuTest, MatchesReferenceExactly) {
  std::mt19937 rng(11);
  for (const auto& variant : CpuVariants()) {
    VariantScope scope(variant);
    for (int64_t dim : {1, 7, 64, 4099}) {
      constexpr int64_t kTokens = 9;
      std::vector<float> got = RandomVector(kTokens * (dim + 3), rng), want = got;
      const std::vector<float> before = got;
      const std::vector<std::vector<int32_t>> experts = {{0, 3, 8}, {3}, {1, 2, 3, 7}, {}};
      for (const std::vector<int32_t>& rows : experts) {
        const std::vector<float> in = RandomVector(static_cast<int64_t>(rows.size()) * dim, rng);
        const std::vector<float> w = RandomVector(static_cast<int64_t>(rows.size()), rng);
        ASSERT_TRUE(ScaledScatterAdd(scope.ctx(), Scatter(in, rows, w, &got, dim, kTokens)).ok());
        reference::ScaledScatterAdd(Scatter(in, rows, w, &want, dim, kTokens));
      }
      EXPECT_EQ(got, want) << variant.Name() << " dim " << dim;
      for (int64_t j = 0; j < dim; ++j) {  // tokens 4, 5 and 6 were routed nowhere
        EXPECT_EQ(got[5 * (dim + 3) + j], before[5 * (dim + 3) + j]);
      }
      EXPECT_NE(got[3 * (dim + 3)], before[3 * (dim + 3)]);
    }
  }
}

TEST(ScaledScatterAddDispatchTest, RejectsBadInput) {
  std::vector<float> in(8, 1.0f), w(2, 0.5f), out(4 * 7, 0.0f);
  const std::vector<int32_t> rows = {1, 3};
  const ScaledScatterAddParams p = Scatter(in, rows, w, &out, 4, 4);
  ASSERT_TRUE(ScaledScatterAdd(OpContext{}, p).ok());
  EXPECT_EQ(out[7], 0.5f);
  const auto code = [](const ScaledScatterAddParams& q) {
    return ScaledScatterAdd(OpContext{}, q).code();
  };
  ScaledScatterAddParams bad = p;
  bad.rows = nullptr;
  EXPECT_EQ(code(bad), absl::StatusCode::kInvalidArgument);
  bad = p;
  bad.out_rows = 3;  // rows[1] = 3 is now outside
  const absl::Status range = ScaledScatterAdd(OpContext{}, bad);
  EXPECT_EQ(range.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(range.message().find("rows[1] = 3"), std::string::npos) << range;
  bad = p;
  bad.in_row_stride = 3;
  EXPECT_EQ(code(bad), absl::StatusCode::kInvalidArgument);
  bad = p;
  bad.in = out.data() + 2;  // inside out
  EXPECT_EQ(code(bad), absl::StatusCode::kInvalidArgument);
  bad = p;
  bad.num_rows = -1;
  EXPECT_EQ(code(bad), absl::StatusCode::kInvalidArgument);
  bad = ScaledScatterAddParams{};
  bad.num_rows = 0;  // nothing to do, whatever else is set
  EXPECT_TRUE(ScaledScatterAdd(OpContext{}, bad).ok());
  if (!SupportsElementwise(Device::kCuda)) {
    EXPECT_EQ(ScaledScatterAdd(OpContext{Device::kCuda, nullptr}, p).code(),
              absl::StatusCode::kUnimplemented);
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
