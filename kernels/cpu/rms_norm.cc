#include <cmath>

#include "kernels/cpu/cpu_ops.h"

namespace pd::kernels::cpu {

void RmsNorm(const RmsNormParams& p) {
  const float* in = static_cast<const float*>(p.in);
  float* out = static_cast<float*>(p.out);
  constexpr int kLanes = 16;  // independent partial sums so the reduction vectorises
  for (int64_t r = 0; r < p.num_rows; ++r) {
    const float* x = in + r * p.in_row_stride;
    float* y = out + r * p.out_row_stride;
    float partial[kLanes] = {};
    int64_t i = 0;
    for (; i + kLanes <= p.dim; i += kLanes) {
      for (int l = 0; l < kLanes; ++l) {
        partial[l] += x[i + l] * x[i + l];
      }
    }
    for (; i < p.dim; ++i) {
      partial[0] += x[i] * x[i];
    }
    float sum_sq = 0.0f;
    for (int l = 0; l < kLanes; ++l) {
      sum_sq += partial[l];
    }
    const float inv_rms = 1.0f / std::sqrt(sum_sq / static_cast<float>(p.dim) + p.eps);
    for (int64_t j = 0; j < p.dim; ++j) {
      y[j] = p.weight[j] * (x[j] * inv_rms);
    }
  }
}

}  // namespace pd::kernels::cpu
