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

__device__ inline float WarpReduceMax(float v) {
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
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
    case DType::kI8:  // the code; the caller multiplies by the row's scale (KvRowScale)
      return static_cast<float>(static_cast<const int8_t*>(base)[off]);
    case DType::kF8E4M3:
      return E4M3ToF32(static_cast<const uint8_t*>(base)[off]);
    case DType::kI4:  // (two codes a byte: KvI4Code reads them, KvI4Scale their scales)
      break;
  }
  return 0.0f;
}

// The f32 scale of row (K or V, kv_head, pos) of an i8 or fp8 cache; 1 for the unquantized
// dtypes (so LoadKv(...) * KvRowScale(...) is the stored value for them all; i4 rows have a
// scale per group: KvI4Scale).
__device__ inline float KvRowScale(const KvCacheView& c, int64_t block_id, int64_t kv_head,
                                   int64_t pos, bool value) {
  if (!IsQuantizedKvDType(c.dtype)) {
    return 1.0f;
  }
  return *reinterpret_cast<const float*>(static_cast<const char*>(c.base) +
                                         KvScaleByteOffset(c, block_id, kv_head, pos, value));
}

// Quantizes one row x[0, n) into codes q and *scale by the rule of kernels/attention_params.h,
// serially in one thread, with the reference's float operations (bits equal to the CPU's).
__device__ inline void QuantizeKvRow(const float* x, int64_t n, DType dtype, uint8_t* q,
                                     float* scale) {
  if (dtype == DType::kI4) {
    QuantizeI4Row(x, n, q, scale);  // (a scale per group: KvScalesPerRow of them)
    return;
  }
  bool finite = true;
  float amax = 0.0f;
  for (int64_t d = 0; d < n; ++d) {
    finite = finite && isfinite(x[d]);
    amax = fmaxf(amax, fabsf(x[d]));
  }
  if (!finite || amax == 0.0f) {
    *scale = finite ? 0.0f : __int_as_float(0x7fc00000);  // quiet NaN
    for (int64_t d = 0; d < n; ++d) q[d] = 0;
    return;
  }
  const float limit = dtype == DType::kI8 ? 127.0f : 448.0f;
  *scale = __fdiv_rn(amax, limit);
  const float inv = __fdiv_rn(limit, amax);
  for (int64_t d = 0; d < n; ++d) {
    const float y = __fmul_rn(x[d], inv);
    if (dtype == DType::kI8) {
      const float r = fminf(127.0f, fmaxf(-127.0f, rintf(y)));
      q[d] = static_cast<uint8_t>(static_cast<int8_t>(r));
    } else {
      q[d] = F32ToE4M3(y);
    }
  }
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
    case DType::kI4:
      return;  // quantized rows are written whole by QuantizeKvRow
  }
}

}  // namespace pd::kernels::cuda
