#include <algorithm>
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

// The f32 scale of the row (K or V, kv head, token position) of a quantized cache.
float* ScalePtr(const KvCacheView& c, const int32_t* table, bool value, int64_t kv_head,
                int64_t pos) {
  const int64_t block = table[pos / c.block_size];
  char* scales = static_cast<char*>(c.base) + block * c.block_stride + c.scale_offset;
  return reinterpret_cast<float*>(scales) + c.layer * c.scale_layer_stride +
         (value ? c.scale_kv_stride : 0) + kv_head * c.scale_head_stride + pos % c.block_size;
}

// Element (K or V, kv head, token position, d) of the cache, widened (or dequantized) to f32.
double Load(const KvCacheView& c, const int32_t* table, bool value, int64_t kv_head, int64_t pos,
            int64_t d) {
  const int64_t off = Offset(c, table, value, kv_head, pos, d);
  switch (c.dtype) {
    case DType::kF32:
      return static_cast<const float*>(c.base)[off];
    case DType::kBF16:
      return Bf16ToF32(static_cast<const uint16_t*>(c.base)[off]);
    case DType::kF16:
      return F16ToF32(static_cast<const uint16_t*>(c.base)[off]);
    case DType::kI8: {
      const float code = static_cast<float>(static_cast<const int8_t*>(c.base)[off]);
      return code * *ScalePtr(c, table, value, kv_head, pos);
    }
    case DType::kF8E4M3: {
      const float code = E4M3ToF32(static_cast<const uint8_t*>(c.base)[off]);
      return code * *ScalePtr(c, table, value, kv_head, pos);
    }
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
    case DType::kI8:
    case DType::kF8E4M3:
      return;  // quantized rows are written whole by QuantizeRow
  }
}

// The quantization rule of kernels/attention_params.h, one element at a time.
void QuantizeRow(const float* x, int64_t n, DType dtype, uint8_t* q, float* scale) {
  bool finite = true;
  float amax = 0.0f;
  for (int64_t d = 0; d < n; ++d) {
    finite = finite && std::isfinite(x[d]);
    amax = std::max(amax, std::fabs(x[d]));
  }
  if (!finite || amax == 0.0f) {
    *scale = finite ? 0.0f : std::numeric_limits<float>::quiet_NaN();
    std::fill(q, q + n, uint8_t{0});
    return;
  }
  const float limit = dtype == DType::kI8 ? 127.0f : 448.0f;
  *scale = amax / limit;
  const float inv = limit / amax;
  for (int64_t d = 0; d < n; ++d) {
    const float y = x[d] * inv;
    if (dtype == DType::kI8) {
      const float r = std::min(127.0f, std::max(-127.0f, std::nearbyint(y)));
      q[d] = static_cast<uint8_t>(static_cast<int8_t>(r));
    } else {
      q[d] = F32ToE4M3(y);
    }
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
      dot += static_cast<double>(q[d]) * Load(c, table, false, kv_head, t, d);
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
      acc += scores[t] * Load(c, table, true, kv_head, t, d);
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
      if (IsQuantizedKvDType(c.dtype)) {
        auto* codes = static_cast<uint8_t*>(c.base);
        const int64_t pos = p.positions[j];
        QuantizeRow(p.k + j * p.k_token_stride + h * c.head_dim, c.head_dim, c.dtype,
                    codes + Offset(c, table, false, h, pos, 0), ScalePtr(c, table, false, h, pos));
        QuantizeRow(p.v + j * p.v_token_stride + h * c.head_dim, c.head_dim, c.dtype,
                    codes + Offset(c, table, true, h, pos, 0), ScalePtr(c, table, true, h, pos));
        continue;
      }
      for (int64_t d = 0; d < c.head_dim; ++d) {
        Store(c, Offset(c, table, false, h, p.positions[j], d),
              p.k[j * p.k_token_stride + h * c.head_dim + d]);
        Store(c, Offset(c, table, true, h, p.positions[j], d),
              p.v[j * p.v_token_stride + h * c.head_dim + d]);
      }
    }
  }
}

void ReadKv(const ReadKvParams& p) {
  const KvCacheView& c = p.cache;
  for (int64_t j = 0; j < p.num_tokens; ++j) {
    const int64_t seq = p.token_seq != nullptr ? p.token_seq[j] : 0;
    const int32_t* table = p.block_tables + seq * p.max_blocks_per_seq;
    for (int64_t h = 0; h < c.num_kv_heads; ++h) {
      for (int64_t d = 0; d < c.head_dim; ++d) {
        p.k[j * p.k_token_stride + h * c.head_dim + d] =
            static_cast<float>(Load(c, table, false, h, p.positions[j], d));
        p.v[j * p.v_token_stride + h * c.head_dim + d] =
            static_cast<float>(Load(c, table, true, h, p.positions[j], d));
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
