// GPU tests: run where a CUDA device exists, skip cleanly elsewhere (label gpu).
#include <cuda_runtime.h>

#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/norm.h"
#include "kernels/reference/reference_ops.h"

namespace pd::kernels {
namespace {

TEST(RmsNormCudaLaunchTest, ThreadsPerBlockCoversRowInWarps) {
  EXPECT_EQ(cuda::RmsNormThreadsPerBlock(1), 32);
  EXPECT_EQ(cuda::RmsNormThreadsPerBlock(64), 64);
  EXPECT_EQ(cuda::RmsNormThreadsPerBlock(65), 96);
  EXPECT_EQ(cuda::RmsNormThreadsPerBlock(4096), 1024);
}

TEST(RmsNormCudaTest, MatchesReference) {
  if (cuda::VisibleDeviceCount() == 0) {
    GTEST_SKIP() << "no CUDA device";
  }
  const int64_t rows = 5, dim = 1000;
  std::mt19937 rng(7);
  std::normal_distribution<float> dist;
  std::vector<float> in(rows * dim), w(dim), want(rows * dim), got(rows * dim);
  for (float& v : in) v = dist(rng);
  for (float& v : w) v = dist(rng);
  float *d_in, *d_w, *d_out;
  ASSERT_EQ(cudaMalloc(&d_in, in.size() * 4), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&d_w, w.size() * 4), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&d_out, got.size() * 4), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(d_in, in.data(), in.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(d_w, w.data(), w.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
  RmsNormParams p{d_in, d_w, d_out, rows, dim, dim, dim, 1e-5f, DType::kF32};
  ASSERT_TRUE(RmsNorm(OpContext{Device::kCuda, nullptr}, p).ok());
  ASSERT_EQ(cudaMemcpy(got.data(), d_out, got.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  reference::RmsNorm(RmsNormParams{in.data(), w.data(), want.data(), rows, dim, dim, dim, 1e-5f,
                                   DType::kF32});
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_NEAR(got[i], want[i], 1e-4) << i;
  }
  cudaFree(d_in);
  cudaFree(d_w);
  cudaFree(d_out);
}

}  // namespace
}  // namespace pd::kernels
