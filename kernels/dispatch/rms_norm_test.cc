#include <cmath>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/norm.h"
#include "kernels/reference/reference_ops.h"

namespace pd::kernels {
namespace {

RmsNormParams Params(const std::vector<float>& in, const std::vector<float>& w,
                     std::vector<float>* out, int64_t rows, int64_t dim, int64_t stride) {
  RmsNormParams p;
  p.in = in.data();
  p.weight = w.data();
  p.out = out->data();
  p.num_rows = rows;
  p.dim = dim;
  p.in_row_stride = stride;
  p.out_row_stride = stride;
  p.eps = 1e-5f;
  return p;
}

// Hand-computed: x = [3, 4], mean(x^2) = 12.5, rms = sqrt(12.5 + 0) = 3.5355339;
// y = w * x / rms = [2*0.8485281, 0.5*1.1313708].
TEST(RmsNormReferenceTest, HandComputed) {
  std::vector<float> in = {3, 4}, w = {2, 0.5f}, out(2);
  RmsNormParams p = Params(in, w, &out, 1, 2, 2);
  p.eps = 0;
  reference::RmsNorm(p);
  EXPECT_NEAR(out[0], 1.6970563f, 1e-6);
  EXPECT_NEAR(out[1], 0.5656854f, 1e-6);
}

// CPU kernel against the reference on random and edge shapes: max-abs and NMSE bounds.
TEST(RmsNormCpuTest, MatchesReference) {
  std::mt19937 rng(42);
  std::normal_distribution<float> dist(0.0f, 2.0f);
  for (int64_t dim : {1, 7, 16, 64, 100, 4096}) {
    for (int64_t rows : {1, 3, 17}) {
      const int64_t stride = dim + (dim % 3);  // some strided rows
      std::vector<float> in(rows * stride), w(dim);
      for (float& v : in) v = dist(rng);
      for (float& v : w) v = dist(rng);
      std::vector<float> got(rows * stride, -1), want(rows * stride, -1);
      ASSERT_TRUE(RmsNorm(OpContext{}, Params(in, w, &got, rows, dim, stride)).ok());
      reference::RmsNorm(Params(in, w, &want, rows, dim, stride));
      double err = 0, ref = 0, max_abs = 0;
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t i = 0; i < dim; ++i) {
          double d = got[r * stride + i] - want[r * stride + i];
          err += d * d;
          ref += static_cast<double>(want[r * stride + i]) * want[r * stride + i];
          max_abs = std::max(max_abs, std::abs(d));
        }
      }
      EXPECT_LT(max_abs, 1e-4) << "dim " << dim << " rows " << rows;
      EXPECT_LT(err / std::max(ref, 1e-30), 1e-10) << "dim " << dim << " rows " << rows;
    }
  }
}

TEST(RmsNormCpuTest, InPlace) {
  std::vector<float> x = {1, 2, 3, 4}, w = {1, 1, 1, 1}, want(4);
  reference::RmsNorm(Params(x, w, &want, 1, 4, 4));
  ASSERT_TRUE(RmsNorm(OpContext{}, Params(x, w, &x, 1, 4, 4)).ok());
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(x[i], want[i], 1e-6);
}

TEST(RmsNormDispatchTest, RejectsBadInput) {
  std::vector<float> in(8), w(4), out(8);
  RmsNormParams p = Params(in, w, &out, 2, 4, 4);
  p.weight = nullptr;
  EXPECT_EQ(RmsNorm(OpContext{}, p).code(), absl::StatusCode::kInvalidArgument);
  p = Params(in, w, &out, 2, 4, 3);
  absl::Status s = RmsNorm(OpContext{}, p);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("stride"), absl::string_view::npos) << s;
  p = Params(in, w, &out, 0, 4, 4);
  EXPECT_EQ(RmsNorm(OpContext{}, p).code(), absl::StatusCode::kInvalidArgument);
  p = Params(in, w, &out, 2, 4, 4);
  p.eps = NAN;
  EXPECT_EQ(RmsNorm(OpContext{}, p).code(), absl::StatusCode::kInvalidArgument);
  p = Params(in, w, &out, 2, 4, 4);
  p.dtype = DType::kBF16;
  EXPECT_EQ(RmsNorm(OpContext{}, p).code(), absl::StatusCode::kUnimplemented);
  EXPECT_FALSE(SupportsRmsNorm(Device::kCpu, DType::kBF16));
  p.dtype = DType::kI8;  // KV-cache-only
  EXPECT_EQ(RmsNorm(OpContext{}, p).code(), absl::StatusCode::kUnimplemented);
  EXPECT_FALSE(SupportsRmsNorm(Device::kCpu, DType::kI8));
}

}  // namespace
}  // namespace pd::kernels
