// The int8 MatMul's own kernels (the GEMM itself is cuBLAS's, matmul_cublas.cc): activations
// quantized per row by kernels/matmul_params.h's QuantizeRowsInt8 rule, and the f32 epilogue.
// Both bitwise equal to the CPU: the row maximum is exact in any order, every other step is one
// correctly rounded float operation (__fdiv_rn, __fmul_rn, rintf: round half to even).
#include <cmath>
#include <cstdint>

#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/launch_config.h"

namespace pd::kernels::cuda {
namespace {

constexpr int kWarps = kQuantizeRowThreads / kWarpSize;

// One block per row: amax and finiteness by a block reduction, then the codes.
__global__ void __launch_bounds__(kQuantizeRowThreads)
    QuantizeRowsKernel(const float* x, int64_t cols, int64_t x_row_stride, int8_t* q,
                       float* scales) {
  __shared__ float warp_max[kWarps];
  __shared__ int warp_bad[kWarps];
  const int64_t r = blockIdx.x;
  const float* row = x + r * x_row_stride;
  int8_t* out = q + r * cols;
  float amax = 0.0f;
  int bad = 0;
  for (int64_t i = threadIdx.x; i < cols; i += blockDim.x) {
    const float v = row[i];
    bad |= isfinite(v) ? 0 : 1;
    amax = fmaxf(amax, fabsf(v));
  }
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, offset));
    bad |= __shfl_xor_sync(0xffffffffu, bad, offset);
  }
  if (threadIdx.x % kWarpSize == 0) {
    warp_max[threadIdx.x / kWarpSize] = amax;
    warp_bad[threadIdx.x / kWarpSize] = bad;
  }
  __syncthreads();
  amax = 0.0f;
  bad = 0;
  for (int w = 0; w < kWarps; ++w) {
    amax = fmaxf(amax, warp_max[w]);
    bad |= warp_bad[w];
  }
  if (bad != 0 || amax == 0.0f) {
    for (int64_t i = threadIdx.x; i < cols; i += blockDim.x) {
      out[i] = 0;
    }
    if (threadIdx.x == 0) {
      scales[r] = bad != 0 ? __int_as_float(0x7fc00000) : 0.0f;  // NaN: the row's y is NaN
    }
    return;
  }
  const float inv = __fdiv_rn(127.0f, amax);
  for (int64_t i = threadIdx.x; i < cols; i += blockDim.x) {
    const float c = fminf(127.0f, fmaxf(-127.0f, rintf(__fmul_rn(row[i], inv))));
    out[i] = static_cast<int8_t>(c);
  }
  if (threadIdx.x == 0) {
    scales[r] = __fdiv_rn(amax, 127.0f);
  }
}

__global__ void MatMulI8EpilogueKernel(const int32_t* acc, const float* sx, const float* w_scales,
                                       const float* bias, float* y, int64_t rows, int64_t out,
                                       int64_t y_row_stride, bool accumulate) {
  const int64_t n = rows * out;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const RowCol rc = RowColAt(i, out);
    float* dst = y + rc.row * y_row_stride + rc.col;
    *dst = MatMulI8Output(acc[i], sx[rc.row], w_scales[rc.col], bias, rc.col,
                          accumulate ? *dst : 0.0f, accumulate);
  }
}

}  // namespace

cudaError_t LaunchQuantizeRowsI8(const float* x, int64_t rows, int64_t cols, int64_t x_row_stride,
                                 int8_t* q, float* scales, cudaStream_t stream) {
  if (rows <= 0 || rows > kMaxGridX) {
    return cudaErrorInvalidConfiguration;
  }
  QuantizeRowsKernel<<<static_cast<unsigned>(rows), kQuantizeRowThreads, 0, stream>>>(
      x, cols, x_row_stride, q, scales);
  return cudaGetLastError();
}

cudaError_t LaunchMatMulI8Epilogue(const int32_t* acc, const float* sx, const float* w_scales,
                                   const float* bias, float* y, int64_t rows, int64_t out,
                                   int64_t y_row_stride, bool accumulate, cudaStream_t stream) {
  const LaunchShape s = ElementwiseLaunch(rows * out);
  MatMulI8EpilogueKernel<<<static_cast<unsigned>(s.grid), s.threads, 0, stream>>>(
      acc, sx, w_scales, bias, y, rows, out, y_row_stride, accumulate);
  return cudaGetLastError();
}

}  // namespace pd::kernels::cuda
