// Element-wise CUDA kernels: Convert, SiluMul, Add, ScaledScatterAdd, the MatMul bias step and
// RoPE. One thread per item over a grid-stride loop (ElementwiseLaunch); dtypes decided at run
// time.
#include <cmath>

#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/device_utils.cuh"
#include "kernels/cuda/launch_config.h"

namespace pd::kernels::cuda {
namespace {

// First item of this thread and the stride between its items.
__device__ inline int64_t FirstItem() {
  return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ inline int64_t ItemStride() { return static_cast<int64_t>(gridDim.x) * blockDim.x; }

__global__ void ConvertKernel(ConvertParams p) {
  const int64_t step = ItemStride();
  if (p.in_dtype == p.out_dtype) {
    // Bitwise copy keeps NaN payloads, as the CPU and reference do.
    const int64_t words = ConvertItems(p);
    const auto* in = static_cast<const uint16_t*>(p.in);
    auto* out = static_cast<uint16_t*>(p.out);
    for (int64_t i = FirstItem(); i < words; i += step) {
      out[i] = in[i];
    }
    return;
  }
  for (int64_t i = FirstItem(); i < p.n; i += step) {
    StoreKv(p.out, p.out_dtype, i, LoadKv(p.in, p.in_dtype, i));
  }
}

__global__ void SiluMulKernel(SiluMulParams p) {
  const int64_t n = p.num_rows * p.dim;
  for (int64_t i = FirstItem(); i < n; i += ItemStride()) {
    const RowCol rc = RowColAt(i, p.dim);
    const float g = p.gate[rc.row * p.gate_row_stride + rc.col];
    const float u = p.up[rc.row * p.up_row_stride + rc.col];
    p.out[rc.row * p.out_row_stride + rc.col] = g / (1.0f + expf(-g)) * u;
  }
}

__global__ void AddKernel(AddParams p) {
  for (int64_t i = FirstItem(); i < p.n; i += ItemStride()) {
    p.out[i] = p.a[i] + p.b[i];
  }
}

// Rows are distinct, so items write distinct elements. __fmul_rn / __fadd_rn keep nvcc from
// fusing the two into an FMA: the result is bitwise the CPU's.
__global__ void ScaledScatterAddKernel(ScaledScatterAddParams p) {
  const int64_t n = p.num_rows * p.dim;
  for (int64_t i = FirstItem(); i < n; i += ItemStride()) {
    const RowCol rc = RowColAt(i, p.dim);
    float* o = p.out + static_cast<int64_t>(p.rows[rc.row]) * p.out_row_stride + rc.col;
    *o = __fadd_rn(*o, __fmul_rn(p.weights[rc.row], p.in[rc.row * p.in_row_stride + rc.col]));
  }
}

__global__ void BiasInitKernel(float* y, const float* bias, int64_t num_rows, int64_t out_features,
                               int64_t y_row_stride, bool accumulate) {
  const int64_t n = num_rows * out_features;
  for (int64_t i = FirstItem(); i < n; i += ItemStride()) {
    const RowCol rc = RowColAt(i, out_features);
    float* yp = y + rc.row * y_row_stride + rc.col;
    *yp = (accumulate ? *yp : 0.0f) + bias[rc.col];
  }
}

// One thread per (token, head, pair): distinct items touch distinct elements.
__global__ void RopeKernel(RopeParams p) {
  const int64_t n = RopeNumItems(p);
  for (int64_t i = FirstItem(); i < n; i += ItemStride()) {
    const RopeItem it = RopeItemAt(i, p.num_heads, p.num_kv_heads, p.head_dim);
    float* x = (it.is_k ? p.k : p.q) + RopeHeadOffset(p, it);
    // The angle in double: pos * inv_freq loses ~pos * 2^-24 radians in f32.
    const double angle =
        static_cast<double>(p.positions[it.token]) * static_cast<double>(p.inv_freq[it.pair]);
    const float c = static_cast<float>(cos(angle));
    const float s = static_cast<float>(sin(angle));
    const RopePair pr = RopePairAt(p.style, p.head_dim, it.pair);
    const float a = x[pr.a], b = x[pr.b];
    x[pr.a] = a * c - b * s;
    x[pr.b] = a * s + b * c;
  }
}

}  // namespace

cudaError_t LaunchConvert(const ConvertParams& p, cudaStream_t stream) {
  if (p.n <= 0) {
    return cudaSuccess;
  }
  const LaunchShape s = ElementwiseLaunch(ConvertItems(p));
  ConvertKernel<<<static_cast<unsigned>(s.grid), s.threads, 0, stream>>>(p);
  return cudaGetLastError();
}

cudaError_t LaunchSiluMul(const SiluMulParams& p, cudaStream_t stream) {
  const LaunchShape s = ElementwiseLaunch(p.num_rows * p.dim);
  SiluMulKernel<<<static_cast<unsigned>(s.grid), s.threads, 0, stream>>>(p);
  return cudaGetLastError();
}

cudaError_t LaunchAdd(const AddParams& p, cudaStream_t stream) {
  const LaunchShape s = ElementwiseLaunch(p.n);
  AddKernel<<<static_cast<unsigned>(s.grid), s.threads, 0, stream>>>(p);
  return cudaGetLastError();
}

cudaError_t LaunchScaledScatterAdd(const ScaledScatterAddParams& p, cudaStream_t stream) {
  if (p.num_rows <= 0) {
    return cudaSuccess;
  }
  const LaunchShape s = ElementwiseLaunch(p.num_rows * p.dim);
  ScaledScatterAddKernel<<<static_cast<unsigned>(s.grid), s.threads, 0, stream>>>(p);
  return cudaGetLastError();
}

cudaError_t LaunchBiasInit(float* y, const float* bias, int64_t num_rows, int64_t out_features,
                           int64_t y_row_stride, bool accumulate, cudaStream_t stream) {
  const LaunchShape s = ElementwiseLaunch(num_rows * out_features);
  BiasInitKernel<<<static_cast<unsigned>(s.grid), s.threads, 0, stream>>>(
      y, bias, num_rows, out_features, y_row_stride, accumulate);
  return cudaGetLastError();
}

cudaError_t LaunchRope(const RopeParams& p, cudaStream_t stream) {
  const LaunchShape s = ElementwiseLaunch(RopeNumItems(p));
  RopeKernel<<<static_cast<unsigned>(s.grid), s.threads, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace pd::kernels::cuda
