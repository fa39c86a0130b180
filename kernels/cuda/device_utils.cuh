// Device helpers shared by the .cu files of kernels/cuda: warp and block reductions, KV-pool
// element loads and stores. CUDA only; include from .cu files.
#pragma once

#include <cstdint>

#include "kernels/cuda/launch_config.h"
#include "kernels/half.h"
#include "kernels/types.h"

namespace pd::kernels::cuda {

// Butterfly reductions: every lane ends with the warp's result.
__device__ inline float WarpReduceSum(float v) {
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    v += __shfl_xor_sync(0xffffffffu, v, offset);
  }
  return v;
}

__device__ inline double WarpReduceSum(double v) {
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    v += __shfl_xor_sync(0xffffffffu, v, offset);
  }
  return v;
}

__device__ inline unsigned long long WarpReduceSum(unsigned long long v) {
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    v += __shfl_xor_sync(0xffffffffu, v, offset);
  }
  return v;
}

// Element `off` of a KV pool of `dtype`, widened to f32.
__device__ inline float LoadKv(const void* base, DType dtype, int64_t off) {
  switch (dtype) {
    case DType::kF32:
      return static_cast<const float*>(base)[off];
    case DType::kBF16:
      return Bf16ToF32(static_cast<const uint16_t*>(base)[off]);
    case DType::kF16:
      return F16ToF32(static_cast<const uint16_t*>(base)[off]);
    case DType::kI8:
    case DType::kF8E4M3:
      break;  // TODO(#18): quantized caches; dispatch rejects them on CUDA for now
  }
  return 0.0f;
}

// Stores f32 `v` at element `off`, rounded exactly as kernels/half.h (as the CPU WriteKv).
__device__ inline void StoreKv(void* base, DType dtype, int64_t off, float v) {
  switch (dtype) {
    case DType::kF32:
      static_cast<float*>(base)[off] = v;
      return;
    case DType::kBF16:
      static_cast<uint16_t*>(base)[off] = F32ToBf16(v);
      return;
    case DType::kF16:
      static_cast<uint16_t*>(base)[off] = F32ToF16(v);
      return;
    case DType::kI8:
    case DType::kF8E4M3:
      return;  // TODO(#18): quantized caches; dispatch rejects them on CUDA for now
  }
}

}  // namespace pd::kernels::cuda
