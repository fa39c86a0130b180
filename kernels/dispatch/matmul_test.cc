#include "kernels/matmul.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/dispatch/kernel_test_util.h"
#include "kernels/half.h"
#include "kernels/reference/reference_ops.h"

namespace pd::kernels {
namespace {

using testing::Compare;
using testing::CpuVariants;
using testing::ErrorStats;
using testing::RandomVector;
using testing::VariantScope;

// Weights stored as `dtype`, with the f32 values they represent (for building expectations).
struct Weights {
  std::vector<uint8_t> bytes;
  DType dtype;
};

Weights MakeWeights(const std::vector<float>& w, DType dtype) {
  Weights out{std::vector<uint8_t>(w.size() * DTypeSize(dtype)), dtype};
  for (size_t i = 0; i < w.size(); ++i) {
    if (dtype == DType::kF32) {
      std::memcpy(out.bytes.data() + 4 * i, &w[i], 4);
    } else {
      const uint16_t h = dtype == DType::kBF16 ? F32ToBf16(w[i]) : F32ToF16(w[i]);
      std::memcpy(out.bytes.data() + 2 * i, &h, 2);
    }
  }
  return out;
}

struct Case {
  int64_t m, k, n;
  int64_t x_pad, y_pad;  // extra elements per row (strided inputs)
  bool bias, accumulate;
};

// Runs one case through dispatch (ctx) and the reference; returns the error stats.
ErrorStats RunCase(const OpContext& ctx, const Case& c, DType dtype, bool allow_blas,
                   std::mt19937& rng) {
  const int64_t xs = c.k + c.x_pad, ys = c.n + c.y_pad;
  std::vector<float> x = RandomVector(c.m * xs, rng);
  Weights w = MakeWeights(RandomVector(c.n * c.k, rng), dtype);
  std::vector<float> bias = RandomVector(c.n, rng);
  std::vector<float> y0 = c.accumulate ? RandomVector(c.m * ys, rng)
                                       : std::vector<float>(c.m * ys, NAN);  // must be ignored
  MatMulParams p;
  p.x = x.data();
  p.w = w.bytes.data();
  p.bias = c.bias ? bias.data() : nullptr;
  p.num_rows = c.m;
  p.in_features = c.k;
  p.out_features = c.n;
  p.x_row_stride = xs;
  p.y_row_stride = ys;
  p.w_dtype = dtype;
  p.accumulate = c.accumulate;
  p.allow_blas = allow_blas;
  std::vector<uint8_t> workspace(MatMulWorkspaceBytes(ctx, p));
  p.workspace = workspace.data();
  p.workspace_bytes = static_cast<int64_t>(workspace.size());
  std::vector<float> got = y0, want = y0;
  p.y = got.data();
  const absl::Status s = MatMul(ctx, p);
  EXPECT_TRUE(s.ok()) << s;
  p.y = want.data();
  reference::MatMul(p);
  // Compare only the written columns; padding must be untouched.
  std::vector<float> g, e;
  for (int64_t r = 0; r < c.m; ++r) {
    for (int64_t o = 0; o < ys; ++o) {
      if (o < c.n) {
        g.push_back(got[r * ys + o]);
        e.push_back(want[r * ys + o]);
      } else {
        EXPECT_TRUE(std::isnan(got[r * ys + o]) || got[r * ys + o] == y0[r * ys + o]);
      }
    }
  }
  return Compare(g.data(), e.data(), static_cast<int64_t>(g.size()));
}

// Hand-computed: x = [1, 2]; W = [[1, 0], [0, 1], [1, 1]]; bias = [0.5, 0, -1].
TEST(MatMulReferenceTest, HandComputed) {
  const float x[] = {1, 2}, w[] = {1, 0, 0, 1, 1, 1}, bias[] = {0.5f, 0, -1};
  float y[3] = {10, 20, 30};
  MatMulParams p;
  p.x = x;
  p.w = w;
  p.bias = bias;
  p.y = y;
  p.num_rows = 1;
  p.in_features = 2;
  p.out_features = 3;
  p.x_row_stride = 2;
  p.y_row_stride = 3;
  reference::MatMul(p);
  EXPECT_FLOAT_EQ(y[0], 1.5f);
  EXPECT_FLOAT_EQ(y[1], 2.0f);
  EXPECT_FLOAT_EQ(y[2], 2.0f);
  p.accumulate = true;
  reference::MatMul(p);
  EXPECT_FLOAT_EQ(y[0], 3.0f);
  EXPECT_FLOAT_EQ(y[2], 4.0f);
}

// Every ISA x threads x weight dtype, on GEMV, small-m direct and sgemm shapes, including
// tails (k, n not multiples of the vector width), strided rows, bias and accumulate. The f32
// result must match the double reference to accumulation rounding: max-abs <= 1e-6 * k (values
// are N(0, 1), |y| ~ sqrt(k); seen 1.6e-7 * k) and NMSE <= 1e-12 (seen 1.1e-13). Weights are
// exactly representable in their dtype, so bf16/f16 get the same bounds.
TEST(MatMulCpuTest, MatchesReference) {
  const std::vector<Case> cases = {
      {1, 1, 1, 0, 0, false, false},    {1, 7, 3, 0, 0, true, false},
      {1, 16, 8, 0, 0, false, true},    {1, 33, 17, 5, 3, true, true},
      {1, 300, 129, 0, 0, true, false}, {2, 64, 9, 1, 0, false, false},
      {3, 17, 31, 0, 2, true, true},    {4, 100, 20, 0, 0, false, false},
      {5, 48, 13, 3, 0, true, false},   {8, 40, 24, 0, 0, false, true},
      {9, 70, 33, 2, 1, true, false},   {17, 31, 50, 0, 0, false, true},
      {40, 96, 70, 1, 1, true, true},
  };
  std::mt19937 rng(5);
  for (const auto& variant : CpuVariants()) {
    VariantScope scope(variant);
    for (DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
      for (bool blas : {false, true}) {
        for (const Case& c : cases) {
          const ErrorStats e = RunCase(scope.ctx(), c, dtype, blas, rng);
          EXPECT_LE(e.max_abs, 1e-6 * c.k)
              << variant.Name() << " dtype " << static_cast<int>(dtype) << " blas " << blas << " m "
              << c.m << " k " << c.k << " n " << c.n;
          EXPECT_LE(e.nmse, 1e-12) << variant.Name() << " blas " << blas << " m " << c.m;
        }
      }
    }
  }
}

// Shapes big enough to split across threads, to tile the bf16 sgemm path and to use several
// cache blocks of the direct kernel (k = 2100: x blocks of 28 rows).
TEST(MatMulCpuTest, LargerShapesThreaded) {
  std::mt19937 rng(6);
  for (cpu::Isa isa : {cpu::Isa::kAvx2, cpu::DetectedIsa()}) {  // sgemm and direct paths
    VariantScope scope({isa, 3});
    for (DType dtype : {DType::kF32, DType::kBF16}) {
      for (const Case& c :
           {Case{1, 1024, 520, 0, 0, true, false}, Case{24, 600, 300, 0, 0, false, true},
            Case{70, 2100, 40, 0, 0, true, false}}) {
        const ErrorStats e = RunCase(scope.ctx(), c, dtype, /*allow_blas=*/true, rng);
        EXPECT_LE(e.max_abs, 1e-6 * c.k) << "m " << c.m;
        EXPECT_LE(e.nmse, 1e-12) << "m " << c.m;
      }
    }
  }
}

// Batch invariance: a batch of rows gives each row bitwise what it gets alone. With allow_blas
// (the sgemm path on CPUs without AVX-512) only within rounding.
TEST(MatMulCpuTest, BatchedEqualsLoopOfSingles) {
  std::mt19937 rng(7);
  const int64_t m = 19, n = 45;
  for (const auto& variant : CpuVariants()) {
    VariantScope scope(variant);
    for (DType dtype : {DType::kF32, DType::kF16}) {
      for (bool blas : {false, true}) {
        const int64_t k = blas ? 80 : 2100;  // 2100: two input blocks of the direct kernel
        std::vector<float> x = RandomVector(m * k, rng);
        Weights w = MakeWeights(RandomVector(n * k, rng), dtype);
        MatMulParams p;
        p.x = x.data();
        p.w = w.bytes.data();
        p.w_dtype = dtype;
        p.num_rows = m;
        p.in_features = k;
        p.out_features = n;
        p.x_row_stride = k;
        p.y_row_stride = n;
        p.allow_blas = blas;
        std::vector<uint8_t> workspace(MatMulWorkspaceBytes(scope.ctx(), p));
        p.workspace = workspace.data();
        p.workspace_bytes = static_cast<int64_t>(workspace.size());
        std::vector<float> batched(m * n), single(m * n);
        p.y = batched.data();
        ASSERT_TRUE(MatMul(scope.ctx(), p).ok());
        for (int64_t r = 0; r < m; ++r) {
          MatMulParams q = p;
          q.num_rows = 1;
          q.x = x.data() + r * k;
          q.y = single.data() + r * n;
          ASSERT_TRUE(MatMul(scope.ctx(), q).ok());
        }
        if (blas) {
          const ErrorStats e = Compare(batched.data(), single.data(), m * n);
          EXPECT_LE(e.max_abs, 1e-4) << variant.Name();
          EXPECT_LE(e.nmse, 1e-12) << variant.Name();
        } else {
          EXPECT_EQ(batched, single) << variant.Name();
        }
      }
    }
  }
}

TEST(MatMulDispatchTest, RejectsBadInput) {
  std::vector<float> x(64), w(64), y(64);
  MatMulParams p;
  p.x = x.data();
  p.w = w.data();
  p.y = y.data();
  p.num_rows = 2;
  p.in_features = 4;
  p.out_features = 4;
  p.x_row_stride = 4;
  p.y_row_stride = 4;
  EXPECT_TRUE(MatMul(OpContext{}, p).ok());
  MatMulParams bad = p;
  bad.w = nullptr;
  EXPECT_EQ(MatMul(OpContext{}, bad).code(), absl::StatusCode::kInvalidArgument);
  bad = p;
  bad.x_row_stride = 3;
  EXPECT_EQ(MatMul(OpContext{}, bad).code(), absl::StatusCode::kInvalidArgument);
  bad = p;
  bad.out_features = 0;
  EXPECT_EQ(MatMul(OpContext{}, bad).code(), absl::StatusCode::kInvalidArgument);
  bad = p;
  bad.y = x.data() + 2;  // overlaps x
  EXPECT_EQ(MatMul(OpContext{}, bad).code(), absl::StatusCode::kInvalidArgument);
  cpu::SetIsaForTest(cpu::Isa::kScalar);  // the sgemm path (and its workspace) on any CPU
  bad = p;
  bad.w_dtype = DType::kBF16;
  bad.allow_blas = true;
  bad.num_rows = 16;
  bad.x_row_stride = 4;
  std::vector<float> big_x(64), big_y(64);
  bad.x = big_x.data();
  bad.y = big_y.data();
  ASSERT_GT(MatMulWorkspaceBytes(OpContext{}, bad), 0);
  const absl::Status s = MatMul(OpContext{}, bad);  // no workspace
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("workspace"), absl::string_view::npos) << s;
  cpu::SetIsaForTest(cpu::DetectedIsa());
  EXPECT_TRUE(SupportsMatMul(Device::kCpu, DType::kF16));
  for (DType q : {DType::kI8, DType::kF8E4M3}) {  // KV-cache-only dtypes
    EXPECT_FALSE(SupportsMatMul(Device::kCpu, q));
    bad = p;
    bad.w_dtype = q;
    const absl::Status qs = MatMul(OpContext{}, bad);
    EXPECT_EQ(qs.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(qs.message().find("KV-cache-only"), absl::string_view::npos) << qs;
  }
  if (!SupportsMatMul(Device::kCuda, DType::kF32)) {
    EXPECT_EQ(MatMul(OpContext{Device::kCuda, nullptr}, p).code(),
              absl::StatusCode::kUnimplemented);
  }
}

}  // namespace
}  // namespace pd::kernels
