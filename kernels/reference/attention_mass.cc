// AttentionMass, the reference: kernels/attention_mass_params.h's rule, one query head at a
// time.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "kernels/reference/reference_ops.h"

namespace pd::kernels::reference {

void AttentionMass(const AttentionMassParams& in) {
  AttentionMassParams p = in;
  std::vector<float> k, v;
  if (p.k == nullptr) {
    // Keys from the cache: ReadKv of slots [0, keys), then as from f32 rows.
    // (latent: the cache's heads' K rows, then their V rows, make one key.)
    const int64_t keys = p.start_pos + p.num_tokens;
    const int64_t row =
        p.latent ? p.cache->num_kv_heads * p.cache->head_dim : p.num_kv_heads * p.head_dim;
    k.resize(static_cast<size_t>(keys * row));
    v.resize(k.size());
    std::vector<int32_t> positions(static_cast<size_t>(keys));
    for (int64_t t = 0; t < keys; ++t) positions[static_cast<size_t>(t)] = static_cast<int32_t>(t);
    ReadKvParams r;
    r.k = k.data();
    r.v = v.data();
    r.k_token_stride = row;
    r.v_token_stride = row;
    r.cache = *p.cache;
    r.num_tokens = keys;
    r.positions = positions.data();
    r.block_tables = p.block_table;
    r.max_blocks_per_seq = p.num_table_blocks;
    ReadKv(r);
    p.k = k.data();
    p.k_token_stride = row;
    if (p.latent) {
      std::vector<float> entries(static_cast<size_t>(keys * 2 * row));
      for (int64_t t = 0; t < keys; ++t) {
        std::copy(k.begin() + t * row, k.begin() + (t + 1) * row, entries.begin() + 2 * t * row);
        std::copy(v.begin() + t * row, v.begin() + (t + 1) * row,
                  entries.begin() + (2 * t + 1) * row);
      }
      k = std::move(entries);
      p.k = k.data();
      p.k_token_stride = 2 * row;
    }
  }
  const int64_t group = p.num_heads / p.num_kv_heads;
  const float scale = p.scale != 0.0f ? p.scale : 1.0f / std::sqrt(static_cast<float>(p.head_dim));
  for (int64_t g = 0; g < p.num_kv_heads; ++g) {
    for (int64_t j = 0; j < p.num_tokens; ++j) {
      for (int64_t h = g * group; h < (g + 1) * group; ++h) {
        const int64_t n = p.start_pos + j + 1;
        std::vector<float> w(static_cast<size_t>(n));
        float max = -INFINITY;
        for (int64_t t = 0; t < n; ++t) {
          // Eight running sums, lane l taking d = l (mod 8) in order, then added pairwise.
          float lane[8] = {};
          for (int64_t d = 0; d < p.head_dim; ++d) {
            lane[d % 8] += p.q[j * p.q_token_stride + h * p.head_dim + d] *
                           p.k[t * p.k_token_stride + g * p.head_dim + d];
          }
          const float dot = ((lane[0] + lane[1]) + (lane[2] + lane[3])) +
                            ((lane[4] + lane[5]) + (lane[6] + lane[7]));
          w[t] = scale * dot;
          max = std::fmax(max, w[t]);
        }
        float sum = 0.0f;
        for (int64_t t = 0; t < n; ++t) {
          w[t] = std::exp(w[t] - max);
          sum += w[t];
        }
        for (int64_t t = 0; t < n; ++t) p.mass[g * p.mass_head_stride + t] += w[t] / sum;
      }
    }
  }
}

}  // namespace pd::kernels::reference
