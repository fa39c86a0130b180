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

}  // namespace pd::kernels::reference
