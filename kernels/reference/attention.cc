#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/half.h"
#include "kernels/reference/reference_ops.h"

namespace pd::kernels::reference {
namespace {

// Element offset of (K or V, kv head, token position, d) through a block table row (i4: the
// byte holding element d).
int64_t Offset(const KvCacheView& c, const int32_t* table, bool value, int64_t kv_head, int64_t pos,
               int64_t d) {
  const int64_t block = table[pos / c.block_size];
  return block * c.block_stride + c.layer * c.layer_stride + (value ? c.kv_stride : 0) +
         kv_head * c.head_stride + (pos % c.block_size) * KvRowPitch(c.dtype, c.head_dim) +
         (c.dtype == DType::kI4 ? d / 2 : d);
}

// The f32 scales of the row (K or V, kv head, token position) of a quantized cache, one per
// group (KvScalesPerRow).
float* ScalePtr(const KvCacheView& c, const int32_t* table, bool value, int64_t kv_head,
                int64_t pos) {
  const int64_t block = table[pos / c.block_size];
  char* scales = static_cast<char*>(c.base) + block * c.block_stride + c.scale_offset;
  return reinterpret_cast<float*>(scales) + c.layer * c.scale_layer_stride +
         (value ? c.scale_kv_stride : 0) + kv_head * c.scale_head_stride +
         (pos % c.block_size) * KvScalesPerRow(c.dtype, c.head_dim);
}

// The 4-bit two's complement code of element d in its byte, sign-extended.
int I4Code(uint8_t byte, int64_t d) {
  const int nibble = d % 2 == 0 ? byte & 0xF : byte >> 4;
  return nibble >= 8 ? nibble - 16 : nibble;
}

// The i4 row (K or V, kv head, token position) dequantized (code * its group's scale, in
// float) and each group rotated back (KvRotated).
std::vector<float> I4Row(const KvCacheView& c, const int32_t* table, bool value, int64_t kv_head,
                         int64_t pos) {
  const auto* codes = static_cast<const uint8_t*>(c.base) + Offset(c, table, value, kv_head, pos, 0);
  const float* scales = ScalePtr(c, table, value, kv_head, pos);
  const int64_t group = KvScaleGroup(c.dtype, c.head_dim);
  std::vector<float> row(static_cast<size_t>(c.head_dim));
  for (int64_t d = 0; d < c.head_dim; ++d) {
    row[static_cast<size_t>(d)] = static_cast<float>(I4Code(codes[d / 2], d)) * scales[d / group];
  }
  if (KvRotated(c.dtype, c.head_dim)) {
    for (int64_t g = 0; g < c.head_dim / group; ++g) HadamardRotate(row.data() + g * group, group);
  }
  return row;
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
    case DType::kI4:
      return I4Row(c, table, value, kv_head, pos)[static_cast<size_t>(d)];
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
    case DType::kI4:
      return;  // quantized rows are written whole by QuantizeRow
  }
}

// The scale of n values under the rule: NaN when one is NaN or inf, 0 when all are 0 (then
// false: the codes are 0), else amax / limit and *inv = limit / amax (true).
bool RuleScale(const float* x, int64_t n, float limit, float* scale, float* inv) {
  bool finite = true;
  float amax = 0.0f;
  for (int64_t d = 0; d < n; ++d) {
    finite = finite && std::isfinite(x[d]);
    amax = std::max(amax, std::fabs(x[d]));
  }
  if (!finite || amax == 0.0f) {
    *scale = finite ? 0.0f : std::numeric_limits<float>::quiet_NaN();
    return false;
  }
  *scale = amax / limit;
  *inv = limit / amax;
  return true;
}

// The quantization rule of kernels/attention_params.h, one element at a time: for i4, group by
// group, each into its half-bytes (q: n / 2 bytes; scale: one per group).
void QuantizeRow(const float* x, int64_t n, DType dtype, uint8_t* q, float* scale) {
  if (dtype == DType::kI4) {
    const int64_t group = KvScaleGroup(dtype, n);
    std::fill(q, q + n / 2, uint8_t{0});
    std::vector<float> rotated(x, x + n);
    for (int64_t g = 0; g < n / group; ++g) {
      float* xg = rotated.data() + g * group;
      if (KvRotated(dtype, n)) HadamardRotate(xg, group);
      float inv = 0.0f;
      if (!RuleScale(xg, group, 7.0f, &scale[g], &inv)) continue;  // codes 0
      for (int64_t d = 0; d < group; ++d) {
        const float r = std::min(7.0f, std::max(-7.0f, std::nearbyint(xg[d] * inv)));
        const auto nibble = static_cast<uint8_t>(static_cast<int>(r) & 0xF);
        const int64_t e = g * group + d;
        q[e / 2] = static_cast<uint8_t>(q[e / 2] | (e % 2 == 0 ? nibble : nibble << 4));
      }
    }
    return;
  }
  float inv = 0.0f;
  if (!RuleScale(x, n, dtype == DType::kI8 ? 127.0f : 448.0f, scale, &inv)) {
    std::fill(q, q + n, uint8_t{0});
    return;
  }
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
