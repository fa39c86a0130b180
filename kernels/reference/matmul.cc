#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "kernels/half.h"
#include "kernels/reference/reference_ops.h"

namespace pd::kernels::reference {
namespace {

double WeightAt(const MatMulParams& p, int64_t o, int64_t i) {
  const int64_t idx = o * p.in_features + i;
  switch (p.w_dtype) {
    case DType::kF32:
      return static_cast<const float*>(p.w)[idx];
    case DType::kBF16:
      return Bf16ToF32(static_cast<const uint16_t*>(p.w)[idx]);
    case DType::kF16:
      return F16ToF32(static_cast<const uint16_t*>(p.w)[idx]);
    case DType::kI8:      // MatMulI8
    case DType::kF8E4M3:  // KV-cache-only dtypes: MatMul rejects them
    case DType::kI4:
      break;
  }
  return 0.0;
}

// W8A8 (kernels/matmul_params.h): activations quantized row by row, exact integer dot products.
void MatMulI8(const MatMulParams& p) {
  const auto* w = static_cast<const int8_t*>(p.w);
  std::vector<int8_t> xq(p.in_features);
  for (int64_t r = 0; r < p.num_rows; ++r) {
    float sx = 0.0f;
    QuantizeRowsInt8(p.x + r * p.x_row_stride, 1, p.in_features, xq.data(), &sx);
    float* y = p.y + r * p.y_row_stride;
    for (int64_t o = 0; o < p.out_features; ++o) {
      int64_t acc = 0;
      for (int64_t i = 0; i < p.in_features; ++i) {
        acc += int64_t{xq[i]} * w[o * p.in_features + i];
      }
      float v = static_cast<float>(static_cast<int32_t>(acc)) * (sx * p.w_scales[o]);
      if (p.bias != nullptr) {
        v += p.bias[o];
      }
      y[o] = p.accumulate ? y[o] + v : v;
    }
  }
}

}  // namespace

void MatMul(const MatMulParams& p) {
  if (p.w_dtype == DType::kI8) {
    MatMulI8(p);
    return;
  }
  for (int64_t r = 0; r < p.num_rows; ++r) {
    const float* x = p.x + r * p.x_row_stride;
    float* y = p.y + r * p.y_row_stride;
    for (int64_t o = 0; o < p.out_features; ++o) {
      double acc = p.bias != nullptr ? p.bias[o] : 0.0;
      for (int64_t i = 0; i < p.in_features; ++i) {
        acc += static_cast<double>(x[i]) * WeightAt(p, o, i);
      }
      y[o] = static_cast<float>(p.accumulate ? y[o] + acc : acc);
    }
  }
}

}  // namespace pd::kernels::reference

namespace pd::kernels {

void QuantizeRowsInt8(const float* w, int64_t rows, int64_t cols, int8_t* q, float* scales) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = w + r * cols;
    int8_t* out = q + r * cols;
    bool finite = true;
    float amax = 0.0f;
    for (int64_t i = 0; i < cols; ++i) {
      finite = finite && std::isfinite(row[i]);
      amax = std::max(amax, std::fabs(row[i]));
    }
    if (!finite || amax == 0.0f) {
      scales[r] = finite ? 0.0f : std::numeric_limits<float>::quiet_NaN();
      std::fill(out, out + cols, int8_t{0});
      continue;
    }
    scales[r] = amax / 127.0f;
    const float inv = 127.0f / amax;
    for (int64_t i = 0; i < cols; ++i) {
      out[i] =
          static_cast<int8_t>(std::min(127.0f, std::max(-127.0f, std::nearbyint(row[i] * inv))));
    }
  }
}

}  // namespace pd::kernels
