// Parameters of the RMSNorm op family. Plain struct shared by reference, CPU and CUDA code
// (included by .cu files: keep it free of Abseil and glog).
#pragma once

#include <cstdint>

#include "kernels/types.h"

namespace pd::kernels {

// out[r][i] = weight[i] * in[r][i] / sqrt(mean_i(in[r][i]^2) + eps)
struct RmsNormParams {
  const void* in = nullptr;      // [num_rows][in_row_stride], first `dim` used
  const float* weight = nullptr;  // [dim], always f32
  void* out = nullptr;           // [num_rows][out_row_stride]; may alias `in` (in place)
  int64_t num_rows = 0;
  int64_t dim = 0;
  int64_t in_row_stride = 0;   // elements between rows of `in`, >= dim
  int64_t out_row_stride = 0;  // elements between rows of `out`, >= dim
  float eps = 1e-5f;
  DType dtype = DType::kF32;  // of `in` and `out`
};

}  // namespace pd::kernels
