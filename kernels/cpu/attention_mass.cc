// AttentionMass on the CPU: each kv head's row of the mass on its own task, the float rule of
// kernels/attention_mass_params.h in its order (bitwise the reference's).
#include <cmath>
#include <cstdint>
#include <vector>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/kv_rows.h"
#include "kernels/cpu/parallel.h"

namespace pd::kernels::cpu {
namespace {

// q . k as kernels/attention_mass_params.h writes it: eight running sums (lane l takes
// d = l (mod 8), in order), added pairwise. Independent lanes let the compiler use vector
// registers without changing a bit.
float Dot(const float* q, const float* k, int64_t n) {
  float lane[8] = {};
  int64_t d = 0;
  for (; d + 8 <= n; d += 8) {
    for (int l = 0; l < 8; ++l) lane[l] += q[d + l] * k[d + l];
  }
  for (int l = 0; d < n; ++d, ++l) lane[l] += q[d] * k[d];
  return ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
}

}  // namespace

void AttentionMass(const OpContext& ctx, const AttentionMassParams& p) {
  const int64_t group = p.num_heads / p.num_kv_heads;
  const int64_t keys = p.start_pos + p.num_tokens;
  const float scale = p.scale != 0.0f ? p.scale : 1.0f / std::sqrt(static_cast<float>(p.head_dim));
  ParallelStrided(ctx, p.num_kv_heads, NumThreads(ctx), [&](int /*slot*/, int64_t g) {
    std::vector<float> s(static_cast<size_t>(keys));
    float* mass = p.mass + g * p.mass_head_stride;
    // This kv head's keys: the caller's f32 rows, or read from the cache here (ReadKv's values).
    const float* k_head = p.k != nullptr ? p.k + g * p.head_dim : nullptr;
    int64_t k_stride = p.k_token_stride;
    std::vector<float> read;
    if (k_head == nullptr) {
      read.resize(static_cast<size_t>(keys * p.head_dim));
      const KvCacheView& c = *p.cache;
      for (int64_t t = 0; t < keys; ++t) {
        float* row = &read[static_cast<size_t>(t * p.head_dim)];
        if (!p.latent) {
          ReadKvRow(c, p.block_table, t, g, 0, row);
          continue;
        }
        // A latent entry: the K rows of every cache head, then their V rows.
        for (int kv = 0; kv < 2; ++kv) {
          for (int64_t h = 0; h < c.num_kv_heads; ++h) {
            ReadKvRow(c, p.block_table, t, h, kv, row + (kv * c.num_kv_heads + h) * c.head_dim);
          }
        }
      }
      k_head = read.data();
      k_stride = p.head_dim;
    }
    for (int64_t j = 0; j < p.num_tokens; ++j) {
      const int64_t n = p.start_pos + j + 1;
      for (int64_t h = g * group; h < (g + 1) * group; ++h) {
        const float* q = p.q + j * p.q_token_stride + h * p.head_dim;
        float max = -INFINITY;
        for (int64_t t = 0; t < n; ++t) {
          const float* k = k_head + t * k_stride;
          s[t] = scale * Dot(q, k, p.head_dim);
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
