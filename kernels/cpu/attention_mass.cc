// AttentionMass on the CPU: each kv head's row of the mass on its own task, the float rule of
// kernels/attention_mass_params.h in its order (bitwise the reference's).
#include <cmath>
#include <cstdint>
#include <vector>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/parallel.h"

namespace pd::kernels::cpu {

void AttentionMass(const OpContext& ctx, const AttentionMassParams& p) {
  const int64_t group = p.num_heads / p.num_kv_heads;
  const int64_t keys = p.start_pos + p.num_tokens;
  const float scale = p.scale != 0.0f ? p.scale : 1.0f / std::sqrt(static_cast<float>(p.head_dim));
  ParallelStrided(ctx, p.num_kv_heads, NumThreads(ctx), [&](int /*slot*/, int64_t g) {
    std::vector<float> s(static_cast<size_t>(keys));
    float* mass = p.mass + g * p.mass_head_stride;
    for (int64_t j = 0; j < p.num_tokens; ++j) {
      const int64_t n = p.start_pos + j + 1;
      for (int64_t h = g * group; h < (g + 1) * group; ++h) {
        const float* q = p.q + j * p.q_token_stride + h * p.head_dim;
        float max = -INFINITY;
        for (int64_t t = 0; t < n; ++t) {
          const float* k = p.k + t * p.k_token_stride + g * p.head_dim;
          float dot = 0.0f;
          for (int64_t d = 0; d < p.head_dim; ++d) dot += q[d] * k[d];
          s[t] = scale * dot;
          max = std::fmax(max, s[t]);
        }
        float sum = 0.0f;
        for (int64_t t = 0; t < n; ++t) {
          s[t] = std::exp(s[t] - max);
          sum += s[t];
        }
        for (int64_t t = 0; t < n; ++t) mass[t] += s[t] / sum;
      }
    }
  });
}

}  // namespace pd::kernels::cpu
