// The CUDA int8 MatMul (W8A8) emulated on the host through its launch arithmetic
// (MatMulI8Layout, MatMulTile, MatMulI8Output): x quantized per row into the workspace, the
// int8 x int8 -> int32 GEMM in cuBLAS's column-major (T, N) terms, the epilogue; bitwise equal
// to reference::MatMul, as the CUDA path promises.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cuda/launch_config.h"
#include "kernels/matmul_params.h"
#include "kernels/reference/reference_ops.h"

namespace pd::kernels::cuda {
namespace {

std::vector<float> Normal(int64_t n, std::mt19937& rng) {
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

TEST(CudaMatMulI8Test, LayoutAndCall) {
  MatMulParams p;
  p.num_rows = 3;
  p.in_features = 2048;
  p.out_features = 8192;
  p.x_row_stride = 2048;
  p.y_row_stride = 8200;
  p.w_dtype = DType::kI8;
  const MatMulI8Workspace lay = MatMulI8Layout(p);
  EXPECT_EQ(lay.xq, 0);
  EXPECT_GE(lay.sx, 3 * 2048);
  EXPECT_GE(lay.acc, lay.sx + 3 * 4);
  EXPECT_GE(lay.total, lay.acc + 3 * 8192 * 4);
  for (int64_t off : {lay.sx, lay.acc, lay.total}) {
    EXPECT_EQ(off % 256, 0);
  }
  EXPECT_EQ(MatMulWorkspaceBytes(p), lay.total);
  EXPECT_EQ(MatMulTileRows(p), p.out_features);
  const GemmCall g = MatMulTile(p, 0);
  EXPECT_EQ(g.m, 8192);
  EXPECT_EQ(g.n, 3);
  EXPECT_EQ(g.k, 2048);
  EXPECT_EQ(g.lda, 2048);
  EXPECT_EQ(g.ldb, 2048);  // the packed codes
  EXPECT_EQ(g.ldc, 8192);  // the packed int32 sums, not y
  EXPECT_TRUE(MatMulI8Shape(p));
  p.in_features = 2046;
  EXPECT_FALSE(MatMulI8Shape(p));
}

TEST(CudaMatMulI8Test, EmulationIsBitwiseTheReference) {
  std::mt19937 rng(12);
  for (bool accumulate : {false, true}) {
    for (bool with_bias : {false, true}) {
      MatMulParams p;
      p.num_rows = 4;
      p.in_features = 40;
      p.out_features = 9;
      p.x_row_stride = 43;
      p.y_row_stride = 11;
      p.accumulate = accumulate;
      p.w_dtype = DType::kI8;
      std::vector<float> x = Normal(p.num_rows * p.x_row_stride, rng);
      x[2 * p.x_row_stride + 5] = std::numeric_limits<float>::infinity();  // row 2: NaN outputs
      for (int64_t c = 0; c < p.in_features; ++c) {
        x[3 * p.x_row_stride + c] = 0.0f;  // row 3: all zero, scale 0
      }
      const std::vector<float> wf = Normal(p.out_features * p.in_features, rng);
      std::vector<int8_t> wq(wf.size());
      std::vector<float> w_scales(p.out_features);
      QuantizeRowsInt8(wf.data(), p.out_features, p.in_features, wq.data(), w_scales.data());
      const std::vector<float> bias = Normal(p.out_features, rng);
      const std::vector<float> y0 = Normal(p.num_rows * p.y_row_stride, rng);
      std::vector<float> want = y0, got = y0;
      p.x = x.data();
      p.w = wq.data();
      p.w_scales = w_scales.data();
      p.bias = with_bias ? bias.data() : nullptr;
      p.y = want.data();
      reference::MatMul(p);

      // The workspace, as matmul_cublas.cc carves it.
      const MatMulI8Workspace lay = MatMulI8Layout(p);
      std::vector<uint8_t> ws(lay.total);
      auto* xq = reinterpret_cast<int8_t*>(ws.data() + lay.xq);
      auto* sx = reinterpret_cast<float*>(ws.data() + lay.sx);
      auto* acc = reinterpret_cast<int32_t*>(ws.data() + lay.acc);
      for (int64_t r = 0; r < p.num_rows; ++r) {  // LaunchQuantizeRowsI8: the same rule
        QuantizeRowsInt8(x.data() + r * p.x_row_stride, 1, p.in_features, xq + r * p.in_features,
                         sx + r);
      }
      const GemmCall g = MatMulTile(p, 0);
      for (int j = 0; j < g.n; ++j) {  // C(i, j) = sum_l A(l, i) B(l, j), column-major
        for (int i = 0; i < g.m; ++i) {
          int32_t s = 0;
          for (int l = 0; l < g.k; ++l) {
            s += int32_t{wq[g.w_offset + i * g.lda + l]} * xq[j * g.ldb + l];
          }
          acc[j * g.ldc + i] = s;
        }
      }
      for (int64_t i = 0; i < p.num_rows * p.out_features; ++i) {  // the epilogue's items
        const RowCol rc = RowColAt(i, p.out_features);
        float& dst = got[rc.row * p.y_row_stride + rc.col];
        dst = MatMulI8Output(acc[i], sx[rc.row], w_scales[rc.col], p.bias, rc.col,
                             accumulate ? dst : 0.0f, accumulate);
      }
      ASSERT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0)
          << "accumulate " << accumulate << " bias " << with_bias;
      EXPECT_TRUE(std::isnan(got[2 * p.y_row_stride]));
    }
  }
}

}  // namespace
}  // namespace pd::kernels::cuda
