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
    case DType::kI8:
    case DType::kF8E4M3:
      break;  // KV-cache-only dtypes: MatMul rejects them
  }
  return 0.0;
}

}  // namespace

void MatMul(const MatMulParams& p) {
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
