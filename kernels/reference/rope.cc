#include <cmath>

#include "kernels/reference/reference_ops.h"

namespace pd::kernels::reference {
namespace {

void RotateHead(float* x, const RopeParams& p, int64_t pos) {
  const int64_t half = p.head_dim / 2;
  for (int64_t i = 0; i < half; ++i) {
    const double angle = static_cast<double>(pos) * static_cast<double>(p.inv_freq[i]);
    const double c = std::cos(angle), s = std::sin(angle);
    const int64_t ia = p.style == RopeStyle::kInterleaved ? 2 * i : i;
    const int64_t ib = p.style == RopeStyle::kInterleaved ? 2 * i + 1 : i + half;
    const double a = x[ia], b = x[ib];
    x[ia] = static_cast<float>(a * c - b * s);
    x[ib] = static_cast<float>(a * s + b * c);
  }
}

}  // namespace

void Rope(const RopeParams& p) {
  for (int64_t t = 0; t < p.num_tokens; ++t) {
    for (int64_t h = 0; h < p.num_heads; ++h) {
      RotateHead(p.q + t * p.q_token_stride + h * p.head_dim, p, p.positions[t]);
    }
    for (int64_t h = 0; h < p.num_kv_heads; ++h) {
      RotateHead(p.k + t * p.k_token_stride + h * p.head_dim, p, p.positions[t]);
    }
  }
}

}  // namespace pd::kernels::reference
