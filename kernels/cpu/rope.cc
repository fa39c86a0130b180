#include <algorithm>
#include <cmath>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/parallel.h"
#include "kernels/rope_params.h"

namespace pd::kernels::cpu {
namespace {

// Plain loops: the compiler vectorises the rotate-half form; RoPE is a tiny share of a layer.
void RotateHead(float* x, int64_t half, RopeStyle style, const float* cos_v, const float* sin_v) {
  if (style == RopeStyle::kRotateHalf) {
    float* x1 = x + half;
    for (int64_t i = 0; i < half; ++i) {
      const float a = x[i], b = x1[i];
      x[i] = a * cos_v[i] - b * sin_v[i];
      x1[i] = a * sin_v[i] + b * cos_v[i];
    }
    return;
  }
  for (int64_t i = 0; i < half; ++i) {
    const float a = x[2 * i], b = x[2 * i + 1];
    x[2 * i] = a * cos_v[i] - b * sin_v[i];
    x[2 * i + 1] = a * sin_v[i] + b * cos_v[i];
  }
}

}  // namespace

void Rope(const OpContext& ctx, const RopeParams& p) {
  const int64_t half = p.head_dim / 2;
  const int64_t token_work = (p.num_heads + p.num_kv_heads) * p.head_dim;
  const int64_t min_tokens = std::max<int64_t>(1, 16384 / token_work);
  ParallelRange(ctx, p.num_tokens, min_tokens, [&](int64_t begin, int64_t end) {
    float cos_v[kMaxRopeHeadDim / 2], sin_v[kMaxRopeHeadDim / 2];
    for (int64_t t = begin; t < end; ++t) {
      // The angle in double: pos * inv_freq loses ~pos * 2^-24 radians in f32.
      const double pos = p.positions[t];
      for (int64_t i = 0; i < half; ++i) {
        const double angle = pos * static_cast<double>(p.inv_freq[i]);
        cos_v[i] = static_cast<float>(std::cos(angle));
        sin_v[i] = static_cast<float>(std::sin(angle));
      }
      for (int64_t h = 0; h < p.num_heads; ++h) {
        RotateHead(p.q + t * p.q_token_stride + h * p.head_dim, half, p.style, cos_v, sin_v);
      }
      for (int64_t h = 0; h < p.num_kv_heads; ++h) {
        RotateHead(p.k + t * p.k_token_stride + h * p.head_dim, half, p.style, cos_v, sin_v);
      }
    }
  });
}

}  // namespace pd::kernels::cpu
