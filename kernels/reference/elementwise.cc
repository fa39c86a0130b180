#include <cmath>

#include "kernels/reference/reference_ops.h"

namespace pd::kernels::reference {

void SiluMul(const SiluMulParams& p) {
  for (int64_t r = 0; r < p.num_rows; ++r) {
    for (int64_t i = 0; i < p.dim; ++i) {
      const double g = p.gate[r * p.gate_row_stride + i];
      const double u = p.up[r * p.up_row_stride + i];
      p.out[r * p.out_row_stride + i] = static_cast<float>(g / (1.0 + std::exp(-g)) * u);
    }
  }
}

void Add(const AddParams& p) {
  for (int64_t i = 0; i < p.n; ++i) {
    p.out[i] = p.a[i] + p.b[i];  // one f32 rounding: exact in double first, same result
  }
}

void ScaledScatterAdd(const ScaledScatterAddParams& p) {
  for (int64_t i = 0; i < p.num_rows; ++i) {
    for (int64_t j = 0; j < p.dim; ++j) {
      // The product rounded to f32, then the sum (two roundings, as the op specifies).
      const auto product =
          static_cast<float>(static_cast<double>(p.weights[i]) * p.in[i * p.in_row_stride + j]);
      float& o = p.out[static_cast<int64_t>(p.rows[i]) * p.out_row_stride + j];
      o = static_cast<float>(static_cast<double>(o) + product);
    }
  }
}

}  // namespace pd::kernels::reference
