// Parameters of the element-wise ops (SwiGLU gate, residual add). Plain structs shared by every
// backend (included by .cu files: keep them free of Abseil and glog). f32 only.
#pragma once

#include <cstdint>

#include "kernels/types.h"

namespace pd::kernels {

// out[r][i] = silu(gate[r][i]) * up[r][i], silu(z) = z / (1 + exp(-z)): the SwiGLU MLP middle.
// Strides let gate and up be the two halves of one fused [num_rows][2 * dim] projection.
struct SiluMulParams {
  const float* gate = nullptr;  // [num_rows][gate_row_stride]
  const float* up = nullptr;    // [num_rows][up_row_stride]
  float* out = nullptr;         // [num_rows][out_row_stride]; may alias gate or up exactly
  int64_t num_rows = 0;
  int64_t dim = 0;
  int64_t gate_row_stride = 0;  // >= dim, likewise below
  int64_t up_row_stride = 0;
  int64_t out_row_stride = 0;
};

// out[i] = a[i] + b[i] (the residual add when it is not fused into MatMul::accumulate).
struct AddParams {
  const float* a = nullptr;  // [n]
  const float* b = nullptr;  // [n]
  float* out = nullptr;      // [n]; may alias a or b exactly
  int64_t n = 0;
};

}  // namespace pd::kernels
