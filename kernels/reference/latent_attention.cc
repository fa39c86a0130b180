// LatentAttention, the reference: each query's keys read back to f32 (reference ReadKv), then
// a two-pass softmax and the weighted sum in double.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "kernels/reference/reference_ops.h"

namespace pd::kernels::reference {

void LatentAttention(const LatentAttentionParams& p) {
  const KvCacheView& c = p.cache;
  const int64_t half = c.num_kv_heads * c.head_dim, entry = 2 * half;
  const double scale =
      p.scale != 0.0f ? static_cast<double>(p.scale) : 1.0 / std::sqrt(static_cast<double>(entry));
  for (int64_t j = 0; j < p.num_tokens; ++j) {
    const int64_t seq = p.token_seq != nullptr ? p.token_seq[j] : 0;
    const int64_t keys = int64_t{p.positions[j]} + 1;
    // The entries [keys][entry]: the K pieces read into the first half, the V pieces after.
    std::vector<float> entries(static_cast<size_t>(keys * entry));
    std::vector<int32_t> positions(static_cast<size_t>(keys));
    for (int64_t t = 0; t < keys; ++t) positions[static_cast<size_t>(t)] = static_cast<int32_t>(t);
    ReadKvParams r;
    r.k = entries.data();
    r.v = entries.data() + half;
    r.k_token_stride = entry;
    r.v_token_stride = entry;
    r.cache = c;
    r.num_tokens = keys;
    r.positions = positions.data();
    r.block_tables = p.block_tables + seq * p.max_blocks_per_seq;
    r.max_blocks_per_seq = p.max_blocks_per_seq;
    ReadKv(r);
    for (int64_t h = 0; h < p.num_heads; ++h) {
      const float* q = p.q + j * p.q_token_stride + h * entry;
      std::vector<double> w(static_cast<size_t>(keys));
      double max = -INFINITY;
      for (int64_t t = 0; t < keys; ++t) {
        double dot = 0.0;
        for (int64_t e = 0; e < entry; ++e) {
          dot += static_cast<double>(q[e]) * entries[static_cast<size_t>(t * entry + e)];
        }
        w[static_cast<size_t>(t)] = scale * dot;
        max = std::max(max, w[static_cast<size_t>(t)]);
      }
      double sum = 0.0;
      for (double& x : w) {
        x = std::exp(x - max);
        sum += x;
      }
      float* out = p.out + j * p.out_token_stride + h * p.value_dim;
      for (int64_t e = 0; e < p.value_dim; ++e) {
        double acc = 0.0;
        for (int64_t t = 0; t < keys; ++t) {
          acc += w[static_cast<size_t>(t)] * entries[static_cast<size_t>(t * entry + e)];
        }
        out[e] = static_cast<float>(acc / sum);
      }
    }
  }
}

}  // namespace pd::kernels::reference
