#include <cmath>

#include "kernels/reference/reference_ops.h"

namespace pd::kernels::reference {

void RmsNorm(const RmsNormParams& p) {
  const float* in = static_cast<const float*>(p.in);
  float* out = static_cast<float*>(p.out);
  for (int64_t r = 0; r < p.num_rows; ++r) {
    const float* x = in + r * p.in_row_stride;
    float* y = out + r * p.out_row_stride;
    double sum_sq = 0.0;
    for (int64_t i = 0; i < p.dim; ++i) {
      sum_sq += static_cast<double>(x[i]) * x[i];
    }
    const double inv_rms = 1.0 / std::sqrt(sum_sq / static_cast<double>(p.dim) + p.eps);
    for (int64_t i = 0; i < p.dim; ++i) {
      y[i] = static_cast<float>(p.weight[i] * (x[i] * inv_rms));
    }
  }
}

}  // namespace pd::kernels::reference
