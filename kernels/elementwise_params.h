// Parameters of the element-wise ops (SwiGLU gate, residual add, the weighted scatter of a
// mixture-of-experts layer). Plain structs shared by every
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

// out[rows[i]][j] += weights[i] * in[i][j] for i < num_rows, j < dim, with the product rounded
// to f32 before the add (no fused multiply-add, on any device): one expert's outputs added into
// the rows of the tokens routed to it, bitwise the same on every backend. rows must be distinct
// (one writer per output row); on kCpu rows and weights are host memory and dispatch checks the
// rows' range, on kCuda they are device memory and the caller guarantees it.
struct ScaledScatterAddParams {
  const float* in = nullptr;       // [num_rows][in_row_stride]
  const int32_t* rows = nullptr;   // [num_rows], distinct, each in [0, out_rows)
  const float* weights = nullptr;  // [num_rows]
  float* out = nullptr;            // [out_rows][out_row_stride]; disjoint from in
  int64_t num_rows = 0;
  int64_t dim = 0;
  int64_t out_rows = 0;
  int64_t in_row_stride = 0;  // >= dim, likewise below
  int64_t out_row_stride = 0;
};

}  // namespace pd::kernels
