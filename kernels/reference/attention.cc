#include <cmath>
#include <limits>
#include <vector>

#include "kernels/half.h"
#include "kernels/reference/reference_ops.h"

namespace pd::kernels::reference {
namespace {

// Element offset of (K or V, kv head, token position, d) through a block table row.
int64_t Offset(const KvCacheView& c, const int32_t* table, bool value, int64_t kv_head, int64_t pos,
               int64_t d) {
  const int64_t block = table[pos / c.block_size];
  return block * c.block_stride + c.layer * c.layer_stride + (value ? c.kv_stride : 0) +
         kv_head * c.head_stride + (pos % c.block_size) * c.head_dim + d;
}

double Load(const KvCacheView& c, int64_t off) {
  switch (c.dtype) {
    case DType::kF32:
      return static_cast<const float*>(c.base)[off];
    case DType::kBF16:
      return Bf16ToF32(static_cast<const uint16_t*>(c.base)[off]);
    case DType::kF16:
      return F16ToF32(static_cast<const uint16_t*>(c.base)[off]);
  }
  return 0.0;
}

void Store(const KvCacheView& c, int64_t off, float v) {
  switch (c.dtype) {
    case DType::kF32:
      static_cast<float*>(c.base)[off] = v;
      return;
    case DType::kBF16:
      static_cast<uint16_t*>(c.base)[off] = F32ToBf16(v);
      return;
    case DType::kF16:
      static_cast<uint16_t*>(c.base)[off] = F32ToF16(v);
      return;
  }
}

// out[0, head_dim) = softmax_t(scale * q . K[t]) V[t] over keys t in [0, num_keys).
void AttendOne(const KvCacheView& c, const int32_t* table, int64_t kv_head, const float* q,
               int64_t num_keys, double scale, float* out) {
  std::vector<double> scores(num_keys);
  double max_score = -std::numeric_limits<double>::infinity();
  for (int64_t t = 0; t < num_keys; ++t) {
    double dot = 0.0;
    for (int64_t d = 0; d < c.head_dim; ++d) {
      dot += static_cast<double>(q[d]) * Load(c, Offset(c, table, false, kv_head, t, d));
    }
    scores[t] = dot * scale;
    max_score = std::max(max_score, scores[t]);
  }
  double sum = 0.0;
  for (int64_t t = 0; t < num_keys; ++t) {
    scores[t] = std::exp(scores[t] - max_score);
    sum += scores[t];
  }
  for (int64_t d = 0; d < c.head_dim; ++d) {
    double acc = 0.0;
    for (int64_t t = 0; t < num_keys; ++t) {
      acc += scores[t] * Load(c, Offset(c, table, true, kv_head, t, d));
    }
    out[d] = static_cast<float>(acc / sum);
  }
}

double Scale(float scale, int64_t head_dim) {
  return scale != 0.0f ? scale : 1.0 / std::sqrt(static_cast<double>(head_dim));
}

}  // namespace

void WriteKv(const WriteKvParams& p) {
  const KvCacheView& c = p.cache;
  for (int64_t j = 0; j < p.num_tokens; ++j) {
    const int64_t seq = p.token_seq != nullptr ? p.token_seq[j] : 0;
    const int32_t* table = p.block_tables + seq * p.max_blocks_per_seq;
    for (int64_t h = 0; h < c.num_kv_heads; ++h) {
      for (int64_t d = 0; d < c.head_dim; ++d) {
        Store(c, Offset(c, table, false, h, p.positions[j], d),
              p.k[j * p.k_token_stride + h * c.head_dim + d]);
        Store(c, Offset(c, table, true, h, p.positions[j], d),
              p.v[j * p.v_token_stride + h * c.head_dim + d]);
      }
    }
  }
}

void PrefillAttention(const PrefillAttentionParams& p) {
  const int64_t group = p.num_heads / p.cache.num_kv_heads;
  const double scale = Scale(p.scale, p.cache.head_dim);
  for (int64_t i = 0; i < p.num_tokens; ++i) {
    for (int64_t h = 0; h < p.num_heads; ++h) {
      AttendOne(p.cache, p.block_table, h / group,
                p.q + i * p.q_token_stride + h * p.cache.head_dim, p.start_pos + i + 1, scale,
                p.out + i * p.out_token_stride + h * p.cache.head_dim);
    }
  }
}

void DecodeAttention(const DecodeAttentionParams& p) {
  const int64_t group = p.num_heads / p.cache.num_kv_heads;
  const double scale = Scale(p.scale, p.cache.head_dim);
  for (int64_t s = 0; s < p.num_seqs; ++s) {
    for (int64_t h = 0; h < p.num_heads; ++h) {
      AttendOne(p.cache, p.block_tables + s * p.max_blocks_per_seq, h / group,
                p.q + s * p.q_seq_stride + h * p.cache.head_dim, p.context_lens[s], scale,
                p.out + s * p.out_seq_stride + h * p.cache.head_dim);
    }
  }
}

}  // namespace pd::kernels::reference
