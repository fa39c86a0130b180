#include "kernels/matmul.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
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
  EXPECT_FALSE(SupportsMatMul(Device::kCpu, DType::kF8E4M3));  // KV-cache-only dtype
  bad = p;
  bad.w_dtype = DType::kF8E4M3;
  const absl::Status qs = MatMul(OpContext{}, bad);
  EXPECT_EQ(qs.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(qs.message().find("KV-cache-only"), absl::string_view::npos) << qs;
  if (!SupportsMatMul(Device::kCuda, DType::kF32)) {
    EXPECT_EQ(MatMul(OpContext{Device::kCuda, nullptr}, p).code(),
              absl::StatusCode::kUnimplemented);
  }
}

// ---- int8 weights (W8A8) ----

// int8 weights quantized from f32 values, with their scales.
struct I8Weights {
  std::vector<int8_t> q;
  std::vector<float> scales;
};

I8Weights QuantizeWeights(const std::vector<float>& w, int64_t n, int64_t k) {
  I8Weights out{std::vector<int8_t>(n * k), std::vector<float>(n)};
  QuantizeRowsInt8(w.data(), n, k, out.q.data(), out.scales.data());
  return out;
}

// The params of an int8 MatMul over x [m][xs] and y [m][ys], with a workspace sized for ctx.
MatMulParams I8Params(const OpContext& ctx, const Case& c, const float* x, const I8Weights& w,
                      const float* bias, float* y, std::vector<uint8_t>* workspace) {
  MatMulParams p;
  p.x = x;
  p.w = w.q.data();
  p.w_scales = w.scales.data();
  p.w_dtype = DType::kI8;
  p.bias = c.bias ? bias : nullptr;
  p.y = y;
  p.num_rows = c.m;
  p.in_features = c.k;
  p.out_features = c.n;
  p.x_row_stride = c.k + c.x_pad;
  p.y_row_stride = c.n + c.y_pad;
  p.accumulate = c.accumulate;
  workspace->assign(MatMulWorkspaceBytes(ctx, p) + 1, 0);
  p.workspace = workspace->data() + 1;  // unaligned on purpose: the kernel aligns it
  p.workspace_bytes = static_cast<int64_t>(workspace->size()) - 1;
  return p;
}

// Bitwise equality of float vectors (NaN == NaN).
void ExpectSameBits(const std::vector<float>& got, const std::vector<float>& want,
                    const std::string& what) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::memcmp(&got[i], &want[i], sizeof(float)) != 0) {
      ADD_FAILURE() << what << ": element " << i << " of " << got.size() << ": " << got[i] << " vs "
                    << want[i];
      return;
    }
  }
}

TEST(MatMulI8ReferenceTest, QuantizeRowsHandComputed) {
  const float w[] = {1.0f, -2.0f, 0.5f, 0.0f, 0, 0, 0, 0, 1, NAN, 2, 3};
  int8_t q[12];
  float scales[3];
  QuantizeRowsInt8(w, 3, 4, q, scales);
  EXPECT_EQ(scales[0], 2.0f / 127.0f);
  // 1 * 63.5 = 63.5 -> 64 (half to even), -2 -> -127, 0.5 * 63.5 = 31.75 -> 32.
  EXPECT_EQ(q[0], 64);
  EXPECT_EQ(q[1], -127);
  EXPECT_EQ(q[2], 32);
  EXPECT_EQ(q[3], 0);
  EXPECT_EQ(scales[1], 0.0f);  // all zero
  EXPECT_TRUE(std::isnan(scales[2]));
  for (int i = 4; i < 12; ++i) {
    EXPECT_EQ(q[i], 0) << i;
  }
}

// x = [1, -2] (scale 2/127, codes [64, -127]); W = [[127, 0], [-1, 1]] with scales [0.5, 1];
// y = acc * (sx * sw) + bias.
TEST(MatMulI8ReferenceTest, HandComputed) {
  const float x[] = {1.0f, -2.0f}, bias[] = {1.0f, 0.0f}, scales[] = {0.5f, 1.0f};
  const int8_t w[] = {127, 0, -1, 1};
  float y[2] = {10, 20};
  MatMulParams p;
  p.x = x;
  p.w = w;
  p.w_scales = scales;
  p.w_dtype = DType::kI8;
  p.bias = bias;
  p.y = y;
  p.num_rows = 1;
  p.in_features = 2;
  p.out_features = 2;
  p.x_row_stride = 2;
  p.y_row_stride = 2;
  reference::MatMul(p);
  const float sx = 2.0f / 127.0f;
  EXPECT_EQ(y[0], static_cast<float>(64 * 127) * (sx * 0.5f) + 1.0f);
  EXPECT_EQ(y[1], static_cast<float>(-64 - 127) * (sx * 1.0f));
}

// Every CPU path (scalar, AVX2, AVX-512 VNNI) x threads gives the reference's bits: GEMV and
// tiled shapes, k not a multiple of 64 or 16 (tails), strided rows, bias and accumulate.
TEST(MatMulI8CpuTest, MatchesReferenceBitForBit) {
  const std::vector<Case> cases = {
      {1, 1, 1, 0, 0, false, false},    {1, 7, 3, 0, 0, true, false},
      {1, 64, 16, 0, 0, false, true},   {1, 300, 129, 5, 3, true, true},
      {1, 1000, 77, 0, 0, true, false}, {3, 17, 31, 0, 2, true, true},
      {3, 130, 9, 1, 0, false, false},  {8, 40, 24, 0, 0, false, true},
      {8, 193, 35, 2, 1, true, false},  {17, 31, 50, 0, 0, false, true},
      {17, 257, 23, 3, 0, true, true},  {64, 96, 70, 1, 1, true, false},
      {64, 2100, 41, 0, 0, true, true},
  };
  std::mt19937 rng(11);
  cpu::SetIsaForTest(cpu::DetectedIsa());
  std::printf("int8 AVX-512 VNNI path on this CPU: %s\n", cpu::UseAvx512Vnni() ? "yes" : "no");
  for (const auto& variant : CpuVariants()) {
    VariantScope scope(variant);
    for (const Case& c : cases) {
      const int64_t xs = c.k + c.x_pad, ys = c.n + c.y_pad;
      std::vector<float> x = RandomVector(c.m * xs, rng);
      const I8Weights w = QuantizeWeights(RandomVector(c.n * c.k, rng), c.n, c.k);
      std::vector<float> bias = RandomVector(c.n, rng);
      std::vector<float> got =
          c.accumulate ? RandomVector(c.m * ys, rng) : std::vector<float>(c.m * ys, 7.0f);
      std::vector<float> want = got;
      std::vector<uint8_t> ws;
      MatMulParams p = I8Params(scope.ctx(), c, x.data(), w, bias.data(), got.data(), &ws);
      ASSERT_TRUE(MatMul(scope.ctx(), p).ok());
      p.y = want.data();
      reference::MatMul(p);
      ExpectSameBits(got, want, absl::StrCat(variant.Name(), " m ", c.m, " k ", c.k, " n ", c.n));
    }
  }
}

// Row r of a 17-row call is bitwise row r alone; a row of x holding NaN (or inf) gives a NaN
// row of y and leaves the others alone; an all-zero row gives exactly the bias.
TEST(MatMulI8CpuTest, BatchInvarianceNanAndZeroRows) {
  const int64_t m = 17, k = 321, n = 45;
  std::mt19937 rng(12);
  for (const auto& variant : CpuVariants()) {
    VariantScope scope(variant);
    std::vector<float> x = RandomVector(m * k, rng);
    x[3 * k + 100] = NAN;
    x[5 * k + 7] = INFINITY;
    std::fill(x.begin() + 9 * k, x.begin() + 10 * k, 0.0f);
    const I8Weights w = QuantizeWeights(RandomVector(n * k, rng), n, k);
    std::vector<float> bias = RandomVector(n, rng);
    const Case c{m, k, n, 0, 0, true, false};
    std::vector<float> batched(m * n), single(m * n);
    std::vector<uint8_t> ws;
    MatMulParams p = I8Params(scope.ctx(), c, x.data(), w, bias.data(), batched.data(), &ws);
    ASSERT_TRUE(MatMul(scope.ctx(), p).ok());
    for (int64_t r = 0; r < m; ++r) {
      const Case one{1, k, n, 0, 0, true, false};
      std::vector<uint8_t> ws1;
      MatMulParams q =
          I8Params(scope.ctx(), one, x.data() + r * k, w, bias.data(), single.data() + r * n, &ws1);
      ASSERT_TRUE(MatMul(scope.ctx(), q).ok());
    }
    ExpectSameBits(batched, single, variant.Name());
    for (int64_t o = 0; o < n; ++o) {
      EXPECT_TRUE(std::isnan(batched[3 * n + o])) << variant.Name() << " o " << o;
      EXPECT_TRUE(std::isnan(batched[5 * n + o])) << variant.Name() << " o " << o;
      EXPECT_EQ(batched[9 * n + o], bias[o]) << variant.Name() << " o " << o;
      EXPECT_FALSE(std::isnan(batched[4 * n + o])) << variant.Name() << " o " << o;
    }
  }
}

// Quantization error against the f32 MatMul on N(0, 1) data (k = 1024, 64 rows, 256 outputs):
// per element, the error relative to the RMS of its row of y. Measured (printed): max 4.4%,
// mean 0.88%; bounds: max <= 8%, mean <= 1.5%.
TEST(MatMulI8CpuTest, ErrorAgainstF32WithinBound) {
  const int64_t m = 64, k = 1024, n = 256;
  std::mt19937 rng(13);
  std::vector<float> x = RandomVector(m * k, rng), wf = RandomVector(n * k, rng);
  const I8Weights w = QuantizeWeights(wf, n, k);
  const Case c{m, k, n, 0, 0, false, false};
  std::vector<float> yq(m * n), yf(m * n);
  std::vector<uint8_t> ws;
  MatMulParams p = I8Params(OpContext{}, c, x.data(), w, nullptr, yq.data(), &ws);
  ASSERT_TRUE(MatMul(OpContext{}, p).ok());
  MatMulParams pf = p;
  pf.w = wf.data();
  pf.w_scales = nullptr;
  pf.w_dtype = DType::kF32;
  pf.y = yf.data();
  pf.workspace = nullptr;
  pf.workspace_bytes = 0;
  ASSERT_TRUE(MatMul(OpContext{}, pf).ok());
  double max_rel = 0.0, sum_rel = 0.0;
  for (int64_t r = 0; r < m; ++r) {
    double ss = 0.0;
    for (int64_t o = 0; o < n; ++o) {
      ss += static_cast<double>(yf[r * n + o]) * yf[r * n + o];
    }
    const double rms = std::sqrt(ss / n);
    for (int64_t o = 0; o < n; ++o) {
      const double rel = std::abs(static_cast<double>(yq[r * n + o]) - yf[r * n + o]) / rms;
      max_rel = std::max(max_rel, rel);
      sum_rel += rel;
    }
  }
  const double mean_rel = sum_rel / static_cast<double>(m * n);
  std::printf("int8 vs f32 matmul (k %lld): max rel err %.4f, mean rel err %.4f (of row RMS)\n",
              static_cast<long long>(k), max_rel, mean_rel);
  EXPECT_LE(max_rel, 0.08);
  EXPECT_LE(mean_rel, 0.015);
}

TEST(MatMulI8DispatchTest, RejectsBadInput) {
  std::vector<float> x(64), y(64), scales(4, 1.0f);
  std::vector<int8_t> w(64);
  MatMulParams p;
  p.x = x.data();
  p.w = w.data();
  p.w_scales = scales.data();
  p.w_dtype = DType::kI8;
  p.y = y.data();
  p.num_rows = 2;
  p.in_features = 4;
  p.out_features = 4;
  p.x_row_stride = 4;
  p.y_row_stride = 4;
  std::vector<uint8_t> ws(MatMulWorkspaceBytes(OpContext{}, p));
  ASSERT_GT(ws.size(), 0u);
  p.workspace = ws.data();
  p.workspace_bytes = static_cast<int64_t>(ws.size());
  EXPECT_TRUE(SupportsMatMul(Device::kCpu, DType::kI8));
  EXPECT_TRUE(MatMul(OpContext{}, p).ok());
  MatMulParams bad = p;
  bad.w_scales = nullptr;
  absl::Status s = MatMul(OpContext{}, bad);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("w_scales"), absl::string_view::npos) << s;
  bad = p;
  bad.workspace_bytes -= 1;
  s = MatMul(OpContext{}, bad);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("workspace"), absl::string_view::npos) << s;
  bad = p;
  bad.num_rows = 1;
  bad.in_features = kMaxI8InFeatures + 1;
  bad.x_row_stride = bad.in_features;
  s = MatMul(OpContext{}, bad);  // rejected before any pointer is read
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("131072"), absl::string_view::npos) << s;
  // CUDA runs int8 weights wherever it runs the others (W8A8 through cuBLAS's int8 GEMM, which
  // needs in_features a multiple of 4: rejected before any launch otherwise).
  EXPECT_EQ(SupportsMatMul(Device::kCuda, DType::kI8), SupportsMatMul(Device::kCuda, DType::kBF16));
  if (!SupportsMatMul(Device::kCuda, DType::kI8)) {
    EXPECT_EQ(MatMul(OpContext{Device::kCuda, nullptr}, p).code(),
              absl::StatusCode::kUnimplemented);
  } else {
    MatMulParams odd = p;
    odd.num_rows = 1;
    odd.in_features = 6;
    odd.x_row_stride = 6;
    odd.out_features = 2;
    odd.y_row_stride = 2;
    std::vector<uint8_t> ws(MatMulWorkspaceBytes(OpContext{Device::kCuda, nullptr}, odd));
    odd.workspace = ws.data();
    odd.workspace_bytes = static_cast<int64_t>(ws.size());
    s = MatMul(OpContext{Device::kCuda, nullptr}, odd);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_NE(s.message().find("multiple of 4"), absl::string_view::npos) << s;
  }
}

}  // namespace
}  // namespace pd::kernels
