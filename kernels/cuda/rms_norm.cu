#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/device_utils.cuh"
#include "kernels/cuda/launch_config.h"

namespace pd::kernels::cuda {
namespace {

// grid = num_rows, block = RmsNormThreadsPerBlock(dim) (a multiple of 32). Each block reduces
// one row's sum of squares (warp shuffles, then one value per warp through shared memory), then
// scales it.
__global__ void RmsNormKernel(const float* in, const float* __restrict__ weight, float* out,
                              int64_t dim, int64_t in_stride, int64_t out_stride, float eps) {
  __shared__ float warp_sums[kMaxThreadsPerBlock / kWarpSize];
  __shared__ float inv_rms;
  const float* x = in + blockIdx.x * in_stride;
  float* y = out + blockIdx.x * out_stride;

  float sum_sq = 0.0f;
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) {
    sum_sq += x[i] * x[i];
  }
  sum_sq = WarpReduceSum(sum_sq);
  const int warp = threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  if (lane == 0) {
    warp_sums[warp] = sum_sq;
  }
  __syncthreads();
  if (warp == 0) {
    const int num_warps = blockDim.x / kWarpSize;
    float v = lane < num_warps ? warp_sums[lane] : 0.0f;
    v = WarpReduceSum(v);
    if (lane == 0) {
      inv_rms = rsqrtf(v / static_cast<float>(dim) + eps);
    }
  }
  __syncthreads();
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) {
    y[i] = weight[i] * (x[i] * inv_rms);
  }
}

}  // namespace

cudaError_t LaunchRmsNorm(const RmsNormParams& p, cudaStream_t stream) {
  if (p.dtype != DType::kF32 || p.num_rows > kMaxGridX) {
    return cudaErrorInvalidValue;
  }
  const int threads = RmsNormThreadsPerBlock(p.dim);
  RmsNormKernel<<<static_cast<unsigned>(p.num_rows), threads, 0, stream>>>(
      static_cast<const float*>(p.in), p.weight, static_cast<float*>(p.out), p.dim, p.in_row_stride,
      p.out_row_stride, p.eps);
  return cudaGetLastError();
}

}  // namespace pd::kernels::cuda
