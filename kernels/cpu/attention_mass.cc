// AttentionMass on the CPU: one task per kv head, or, with fewer kv heads than threads, one per
// (query, head) and the adds after; either way the float rule of
// kernels/attention_mass_params.h in its order (bitwise the reference's).
#include <algorithm>
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

// Key t of kv head g from the cache, widened as ReadKv widens it; a latent key is the K rows of
// every cache head, then their V rows.
void ReadKey(const AttentionMassParams& p, int64_t g, int64_t t, float* row) {
  const KvCacheView& c = *p.cache;
  if (!p.latent) {
    ReadKvRow(c, p.block_table, t, g, 0, row);
    return;
  }
  for (int kv = 0; kv < 2; ++kv) {
    for (int64_t h = 0; h < c.num_kv_heads; ++h) {
      ReadKvRow(c, p.block_table, t, h, kv, row + (kv * c.num_kv_heads + h) * c.head_dim);
    }
  }
}

// Each kv head's row on its own task: its keys read, its queries' weights computed and added
// in order, one fork-join (when the kv heads keep every thread busy).
void MassByKvHead(const OpContext& ctx, const AttentionMassParams& p) {
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
      for (int64_t t = 0; t < keys; ++t) {
        ReadKey(p, g, t, &read[static_cast<size_t>(t * p.head_dim)]);
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

// Fewer kv heads than threads (MLA's one latent row, a small model): the keys read once,
// every (query, head)'s weights on its own task, then each row adds them in order.
void MassByQueryHead(const OpContext& ctx, const AttentionMassParams& p) {
  const int64_t group = p.num_heads / p.num_kv_heads;
  const int64_t keys = p.start_pos + p.num_tokens;
  const int64_t dim = p.head_dim;
  const float scale = p.scale != 0.0f ? p.scale : 1.0f / std::sqrt(static_cast<float>(dim));
  const int slots = NumThreads(ctx);
  // The keys: the caller's f32 rows, or read from the cache once here (ReadKv's values),
  // [kv head][key][dim]; a latent key is the K rows of every cache head, then their V rows.
  const float* k_base = p.k;
  int64_t k_stride = p.k_token_stride, k_head_stride = dim;
  std::vector<float> read;
  if (k_base == nullptr) {
    read.resize(static_cast<size_t>(p.num_kv_heads * keys * dim));
    ParallelRange(ctx, p.num_kv_heads * keys, 64, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        ReadKey(p, i / keys, i % keys, &read[static_cast<size_t>(i * dim)]);
      }
    });
    k_base = read.data();
    k_stride = dim;
    k_head_stride = keys * dim;
  }
  // Queries in batches whose weights fit kMaxWeights floats: first every (query, head)'s
  // weights on its own task (all heads in parallel, also when one kv head serves them all, as
  // MLA's latent does), then each kv head's row adds them in the order of
  // kernels/attention_mass_params.h (queries ascending, then the group's heads): the same
  // floats added in the same order as one pass per kv head would.
  constexpr int64_t kMaxWeights = int64_t{1} << 22;
  const int64_t batch = std::max<int64_t>(1, kMaxWeights / (p.num_heads * keys));
  std::vector<float> weights;
  for (int64_t j0 = 0; j0 < p.num_tokens; j0 += batch) {
    const int64_t jn = std::min(batch, p.num_tokens - j0);
    weights.resize(static_cast<size_t>(jn * p.num_heads * keys));
    ParallelStrided(ctx, jn * p.num_heads, slots, [&](int /*slot*/, int64_t item) {
      const int64_t j = j0 + item / p.num_heads, h = item % p.num_heads;
      const int64_t n = p.start_pos + j + 1;
      const float* q = p.q + j * p.q_token_stride + h * dim;
      const float* k_head = k_base + (h / group) * k_head_stride;
      float* w = &weights[static_cast<size_t>(item * keys)];
      float max = -INFINITY;
      for (int64_t t = 0; t < n; ++t) {
        w[t] = scale * Dot(q, k_head + t * k_stride, dim);
        max = std::fmax(max, w[t]);
      }
      float sum = 0.0f;
      for (int64_t t = 0; t < n; ++t) {
        w[t] = std::exp(w[t] - max);
        sum += w[t];
      }
      for (int64_t t = 0; t < n; ++t) w[t] = w[t] / sum;
    });
    ParallelStrided(ctx, p.num_kv_heads, slots, [&](int /*slot*/, int64_t g) {
      float* mass = p.mass + g * p.mass_head_stride;
      for (int64_t j = j0; j < j0 + jn; ++j) {
        const int64_t n = p.start_pos + j + 1;
        for (int64_t h = g * group; h < (g + 1) * group; ++h) {
          const float* w = &weights[static_cast<size_t>(((j - j0) * p.num_heads + h) * keys)];
          for (int64_t t = 0; t < n; ++t) mass[t] += w[t];
        }
      }
    });
  }
}

}  // namespace

void AttentionMass(const OpContext& ctx, const AttentionMassParams& p) {
  // Both add the same floats in the same order (kernels/attention_mass_params.h).
  if (p.num_kv_heads >= NumThreads(ctx)) {
    MassByKvHead(ctx, p);
  } else {
    MassByQueryHead(ctx, p);
  }
}

}  // namespace pd::kernels::cpu
