// Parameters of the MatMul op family (the linear layers). Plain struct shared by every backend
// (included by .cu files: keep it free of Abseil and glog).
#pragma once

#include <cstdint>

#include "kernels/types.h"

namespace pd::kernels {

// y[r][o] = sum_i x[r][i] * w[o][i] + bias[o]          (accumulate = false)
// y[r][o] += sum_i x[r][i] * w[o][i] + bias[o]         (accumulate = true: fuses a residual add)
//
// w is row-major [out_features][in_features] (the Hugging Face / llama2.c convention, y = W x per
// row). Weights may be stored as bf16 or f16; they are widened to f32 and all arithmetic is f32.
// num_rows == 1 is the decode GEMV (memory bound); larger num_rows is the prefill GEMM.
struct MatMulParams {
  const float* x = nullptr;     // [num_rows][x_row_stride], first in_features used
  const void* w = nullptr;      // [out_features][in_features] of w_dtype, contiguous
  const float* bias = nullptr;  // [out_features], or nullptr for none
  float* y = nullptr;           // [num_rows][y_row_stride], first out_features written;
                                // must not overlap x, w or bias
  int64_t num_rows = 0;         // tokens (m)
  int64_t in_features = 0;      // k
  int64_t out_features = 0;     // n
  int64_t x_row_stride = 0;     // elements between rows of x, >= in_features
  int64_t y_row_stride = 0;     // elements between rows of y, >= out_features
  DType w_dtype = DType::kF32;
  bool accumulate = false;
  // Lets the CPU backend hand many-row calls to OpenBLAS sgemm where that is faster (CPUs
  // without AVX-512). Off by default because it gives up batch invariance: without it every
  // row of y is bitwise the same whatever num_rows is (the engine relies on that for identical
  // output with and without batching, chunking or prefix-cache hits).
  bool allow_blas = false;
  // Scratch of at least MatMulWorkspaceBytes(ctx, *this) bytes (kernels never allocate); may be
  // nullptr when that is 0. Contents are undefined before and after the call.
  void* workspace = nullptr;
  int64_t workspace_bytes = 0;
};

}  // namespace pd::kernels
