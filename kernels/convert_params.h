// Parameters of the Convert op (bulk dtype conversion). Plain struct shared by every backend
// (included by .cu files: keep it free of Abseil and glog).
#pragma once

#include <cstdint>

#include "kernels/types.h"

namespace pd::kernels {

// out[i] = in[i] converted from in_dtype to out_dtype, rounding as kernels/half.h describes.
// Any pair of dtypes; equal dtypes copy. Used to load checkpoints (bf16 -> f32) and by tests.
struct ConvertParams {
  const void* in = nullptr;  // [n] of in_dtype
  void* out = nullptr;       // [n] of out_dtype; must not overlap `in`
  int64_t n = 0;
  DType in_dtype = DType::kF32;
  DType out_dtype = DType::kF32;
};

}  // namespace pd::kernels
