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
//
// int8 weights (w_dtype == kI8), W8A8 as in SmoothQuant / TensorRT-LLM: weights quantized per
// output row (offline or at load, by QuantizeRowsInt8 below), activations per row of x inside
// MatMul (into the workspace), integer dot products, one f32 rescale. With sx[r], xq[r][*] the
// QuantizeRowsInt8 rule applied to row r of x:
//   acc = sum_i xq[r][i] * wq[o][i]               in int32 (exact: in_features <= kMaxI8InFeatures)
//   float v = static_cast<float>(acc) * (sx[r] * w_scales[o]);
//   if (bias) v += bias[o];
//   y[r][o] = accumulate ? y[r][o] + v : v;
// Every expression is one float operation, so the reference and every CPU path give identical
// bits (and the integer sum being exact, the result is batch invariant). A row of x holding NaN
// or +-inf gets sx = NaN, so its y row is NaN.
//
// QuantizeRowsInt8 (weights and activations), per row of n values (float arithmetic):
//   if any value is NaN or +-inf:  scale = NaN, q[*] = 0
//   amax = max |w[i]|;  amax == 0:  scale = 0, q[*] = 0
//   else scale = amax / 127.0f, inv = 127.0f / amax,
//        q[i] = clamp(nearbyint(w[i] * inv), -127, 127)  (round half to even; -128 unused)
// (the i8 KV-cache rule of kernels/attention_params.h).
struct MatMulParams {
  const float* x = nullptr;         // [num_rows][x_row_stride], first in_features used
  const void* w = nullptr;          // [out_features][in_features] of w_dtype, contiguous
  const float* w_scales = nullptr;  // [out_features], required iff w_dtype == kI8
  const float* bias = nullptr;      // [out_features], or nullptr for none
  float* y = nullptr;               // [num_rows][y_row_stride], first out_features written;
                                    // must not overlap x, w or bias
  int64_t num_rows = 0;             // tokens (m)
  int64_t in_features = 0;          // k
  int64_t out_features = 0;         // n
  int64_t x_row_stride = 0;         // elements between rows of x, >= in_features
  int64_t y_row_stride = 0;         // elements between rows of y, >= out_features
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

// Largest in_features of an int8 MatMul: 127 * 127 * 131072 < 2^31, so the int32 sums are exact.
inline constexpr int64_t kMaxI8InFeatures = 131072;

// Quantizes `rows` rows of `cols` f32 values (w, row-major) to int8 codes q [rows][cols] and one
// f32 scale per row (scales [rows]), by the rule above. Plain C++ (kernels/reference): the
// engine quantizes weights with it at load, tests build int8 weights with it.
void QuantizeRowsInt8(const float* w, int64_t rows, int64_t cols, int8_t* q, float* scales);

}  // namespace pd::kernels
