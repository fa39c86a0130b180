// Paged attention on the CPU. Work is split into tasks of up to kMaxAttentionRows query rows
// that share one kv head (GQA groups, and for prefill several consecutive tokens), so every K/V
// chunk read from the pool (and widened from bf16/f16) serves all rows of the task.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/kv_rows.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/simd.h"
#include "kernels/cpu/vector_ops.h"

namespace pd::kernels::cpu {
namespace {

constexpr int kMaxAttentionRows = 8;  // query rows per task
constexpr int kAttentionChunk = 16;   // keys per online-softmax step
// Below this many multiply-adds a call stays on the calling thread.
constexpr int64_t kMinParallelMacs = int64_t{1} << 16;

struct AttentionRows {
  int num_rows = 0;
  const float* q[kMaxAttentionRows];
  float* out[kMaxAttentionRows];
  int64_t last_key[kMaxAttentionRows];  // row r attends keys [0, last_key[r]]
};

}  // namespace
}  // namespace pd::kernels::cpu

namespace pd::kernels::cpu::scalar {
#include "kernels/cpu/attention_impl.inc"
}  // namespace pd::kernels::cpu::scalar

#if PD_CPU_X86
PD_BEGIN_TARGET_AVX2
namespace pd::kernels::cpu::avx2 {
#include "kernels/cpu/attention_impl.inc"
}  // namespace pd::kernels::cpu::avx2
PD_END_TARGET

PD_BEGIN_TARGET_AVX512
namespace pd::kernels::cpu::avx512 {
#include "kernels/cpu/attention_impl.inc"
}  // namespace pd::kernels::cpu::avx512
PD_END_TARGET
#endif

namespace pd::kernels::cpu {
namespace {

float Scale(float scale, int64_t head_dim) {
  return scale != 0.0f ? scale : static_cast<float>(1.0 / std::sqrt(static_cast<double>(head_dim)));
}

int SlotsFor(const OpContext& ctx, int64_t macs) {
  return macs < kMinParallelMacs ? 1 : NumThreads(ctx);
}

// Where a token's rows live in layer c.layer: kv head 0's K row (V is kv_stride elements
// further, head h head_stride elements) and, for a quantized cache, kv head 0's K scale (V's
// scale_kv_stride floats further, head h scale_head_stride). Shared by WriteKv and ReadKv.
struct TokenRows {
  char* k = nullptr;
  float* k_scale = nullptr;  // quantized caches only
};

TokenRows RowsOf(const KvCacheView& c, const int32_t* block_tables, int64_t max_blocks_per_seq,
                 int64_t seq, int64_t pos) {
  const int64_t block = block_tables[seq * max_blocks_per_seq + pos / c.block_size];
  char* block_base = static_cast<char*>(c.base) + block * c.block_stride * DTypeSize(c.dtype);
  TokenRows rows;
  rows.k = block_base + (c.layer * c.layer_stride +
                         (pos % c.block_size) * KvRowPitch(c.dtype, c.head_dim)) *
                            DTypeSize(c.dtype);
  if (IsQuantizedKvDType(c.dtype)) {
    rows.k_scale = reinterpret_cast<float*>(block_base + c.scale_offset) +
                   c.layer * c.scale_layer_stride +
                   (pos % c.block_size) * KvScalesPerRow(c.dtype, c.head_dim);
  }
  return rows;
}

}  // namespace

void WriteKv(const OpContext& ctx, const WriteKvParams& p) {
  const KvCacheView& c = p.cache;
  const int64_t esize = DTypeSize(c.dtype);
  const int64_t min_tokens = std::max<int64_t>(1, 32768 / (c.num_kv_heads * c.head_dim));
  ParallelRange(ctx, p.num_tokens, min_tokens, [&](int64_t begin, int64_t end) {
    for (int64_t j = begin; j < end; ++j) {
      const TokenRows rows = RowsOf(c, p.block_tables, p.max_blocks_per_seq,
                                    p.token_seq != nullptr ? p.token_seq[j] : 0, p.positions[j]);
      char* k_dst = rows.k;
      if (IsQuantizedKvDType(c.dtype)) {
        float* k_scale = rows.k_scale;
        for (int64_t h = 0; h < c.num_kv_heads; ++h) {
          auto* dst = reinterpret_cast<uint8_t*>(k_dst + h * c.head_stride);
          float* scale = k_scale + h * c.scale_head_stride;
          PD_ISA_DISPATCH(QuantizeRow(p.k + j * p.k_token_stride + h * c.head_dim, c.head_dim,
                                      c.dtype, dst, scale));
          PD_ISA_DISPATCH(QuantizeRow(p.v + j * p.v_token_stride + h * c.head_dim, c.head_dim,
                                      c.dtype, dst + c.kv_stride, scale + c.scale_kv_stride));
        }
        continue;
      }
      for (int64_t h = 0; h < c.num_kv_heads; ++h) {
        char* dst = k_dst + h * c.head_stride * esize;
        PD_ISA_DISPATCH(ConvertRow(p.k + j * p.k_token_stride + h * c.head_dim, DType::kF32, dst,
                                   c.dtype, c.head_dim));
        PD_ISA_DISPATCH(ConvertRow(p.v + j * p.v_token_stride + h * c.head_dim, DType::kF32,
                                   dst + c.kv_stride * esize, c.dtype, c.head_dim));
      }
    }
  });
}

void ReadKvRow(const KvCacheView& c, const int32_t* block_table, int64_t pos, int64_t head,
               int kv, float* dst) {
  const TokenRows rows = RowsOf(c, block_table, 0, 0, pos);
  const char* src = rows.k + (head * c.head_stride + kv * c.kv_stride) * DTypeSize(c.dtype);
  if (!IsQuantizedKvDType(c.dtype)) {
    PD_ISA_DISPATCH(ConvertRow(src, c.dtype, dst, DType::kF32, c.head_dim));
    return;
  }
  const float* scales = rows.k_scale + head * c.scale_head_stride + kv * c.scale_kv_stride;
  const auto* codes = reinterpret_cast<const uint8_t*>(src);
  if (c.dtype == DType::kI4) {
    const int64_t group = KvScaleGroup(c.dtype, c.head_dim);
    for (int64_t d = 0; d < c.head_dim; ++d) {
      const int nibble = d % 2 == 0 ? codes[d / 2] & 0xF : codes[d / 2] >> 4;
      dst[d] = static_cast<float>((nibble ^ 8) - 8) * scales[d / group];
    }
    if (KvRotated(c.dtype, c.head_dim)) {  // (stored rotated: rotate back)
      for (int64_t g = 0; g < c.head_dim; g += group) HadamardRotate(dst + g, group);
    }
    return;
  }
  const float scale = scales[0];
  for (int64_t d = 0; d < c.head_dim; ++d) {
    const float code = c.dtype == DType::kI8 ? static_cast<float>(static_cast<int8_t>(codes[d]))
                                             : E4M3ToF32(codes[d]);
    dst[d] = code * scale;
  }
}

void ReadKv(const OpContext& ctx, const ReadKvParams& p) {
  const KvCacheView& c = p.cache;
  const int64_t min_tokens = std::max<int64_t>(1, 32768 / (c.num_kv_heads * c.head_dim));
  ParallelRange(ctx, p.num_tokens, min_tokens, [&](int64_t begin, int64_t end) {
    for (int64_t j = begin; j < end; ++j) {
      const int64_t seq = p.token_seq != nullptr ? p.token_seq[j] : 0;
      const int32_t* table = p.block_tables + seq * p.max_blocks_per_seq;
      for (int64_t h = 0; h < c.num_kv_heads; ++h) {
        ReadKvRow(c, table, p.positions[j], h, 0, p.k + j * p.k_token_stride + h * c.head_dim);
        ReadKvRow(c, table, p.positions[j], h, 1, p.v + j * p.v_token_stride + h * c.head_dim);
      }
    }
  });
}

void GatherKvRows(const OpContext& ctx, const GatherKvRowsParams& p) {
  const KvCacheView& c = p.cache;
  const int64_t bs = c.block_size, row_bytes = KvRowBytes(c);
  const bool quantized = IsQuantizedKvDType(c.dtype);
  const int64_t scale_bytes = quantized ? 4 * KvScalesPerRow(c.dtype, c.head_dim) : 0;
  auto* base = static_cast<uint8_t*>(c.base);
  // One (layer, kv head) per task: its rows are disjoint from every other task's.
  ParallelStrided(ctx, p.num_layers * c.num_kv_heads, NumThreads(ctx), [&](int, int64_t r) {
    const int64_t layer = r / c.num_kv_heads, g = r % c.num_kv_heads;
    const int32_t* kept = p.keep + (layer * p.keep_heads + p.keep_first_head + g) * p.num_keep;
    for (int64_t i = 0; i < p.num_keep; ++i) {
      const int64_t from_block = p.src_blocks[kept[i] / bs], from_slot = kept[i] % bs;
      const int64_t to_block = p.dst_blocks[i / bs], to_slot = i % bs;
      for (bool value : {false, true}) {
        std::memcpy(base + KvRowByteOffset(c, to_block, layer, value, g, to_slot),
                    base + KvRowByteOffset(c, from_block, layer, value, g, from_slot),
                    static_cast<size_t>(row_bytes));
        if (quantized) {
          std::memcpy(base + KvRowScalesByteOffset(c, to_block, layer, value, g, to_slot),
                      base + KvRowScalesByteOffset(c, from_block, layer, value, g, from_slot),
                      static_cast<size_t>(scale_bytes));
        }
      }
    }
  });
}

void PrefillAttention(const OpContext& ctx, const PrefillAttentionParams& p) {
  const KvCacheView& c = p.cache;
  const int64_t group = p.num_heads / c.num_kv_heads;
  const int64_t heads_per_task = std::min<int64_t>(group, kMaxAttentionRows);
  const int64_t head_splits = (group + heads_per_task - 1) / heads_per_task;
  const int64_t tokens_per_task = std::max<int64_t>(1, kMaxAttentionRows / heads_per_task);
  const int64_t token_tiles = (p.num_tokens + tokens_per_task - 1) / tokens_per_task;
  const int64_t num_tasks = token_tiles * c.num_kv_heads * head_splits;
  const float scale = Scale(p.scale, c.head_dim);
  const int64_t macs = p.num_tokens * (p.start_pos + p.num_tokens) * p.num_heads * c.head_dim;
  ParallelStrided(ctx, num_tasks, SlotsFor(ctx, macs), [&](int, int64_t task) {
    const int64_t split = task % head_splits;
    const int64_t kv_head = task / head_splits % c.num_kv_heads;
    const int64_t tile = task / head_splits / c.num_kv_heads;
    const int64_t h_begin = kv_head * group + split * heads_per_task;
    const int64_t h_end = std::min(kv_head * group + group, h_begin + heads_per_task);
    const int64_t i_end = std::min(p.num_tokens, (tile + 1) * tokens_per_task);
    AttentionRows rows;
    for (int64_t i = tile * tokens_per_task; i < i_end; ++i) {
      for (int64_t h = h_begin; h < h_end; ++h) {
        rows.q[rows.num_rows] = p.q + i * p.q_token_stride + h * c.head_dim;
        rows.out[rows.num_rows] = p.out + i * p.out_token_stride + h * c.head_dim;
        rows.last_key[rows.num_rows] = p.start_pos + i;
        ++rows.num_rows;
      }
    }
    PD_ISA_DISPATCH(AttendRows(rows, c, p.block_table, kv_head, scale));
  });
}

void DecodeAttention(const OpContext& ctx, const DecodeAttentionParams& p) {
  const KvCacheView& c = p.cache;
  const int64_t group = p.num_heads / c.num_kv_heads;
  const int64_t heads_per_task = std::min<int64_t>(group, kMaxAttentionRows);
  const int64_t head_splits = (group + heads_per_task - 1) / heads_per_task;
  const int64_t num_tasks = p.num_seqs * c.num_kv_heads * head_splits;
  const float scale = Scale(p.scale, c.head_dim);
  int64_t macs = 0;
  for (int64_t s = 0; s < p.num_seqs; ++s) {
    macs += p.context_lens[s] * p.num_heads * c.head_dim;
  }
  ParallelStrided(ctx, num_tasks, SlotsFor(ctx, macs), [&](int, int64_t task) {
    const int64_t split = task % head_splits;
    const int64_t kv_head = task / head_splits % c.num_kv_heads;
    const int64_t seq = task / head_splits / c.num_kv_heads;
    const int64_t h_begin = kv_head * group + split * heads_per_task;
    const int64_t h_end = std::min(kv_head * group + group, h_begin + heads_per_task);
    AttentionRows rows;
    for (int64_t h = h_begin; h < h_end; ++h) {
      rows.q[rows.num_rows] = p.q + seq * p.q_seq_stride + h * c.head_dim;
      rows.out[rows.num_rows] = p.out + seq * p.out_seq_stride + h * c.head_dim;
      rows.last_key[rows.num_rows] = p.context_lens[seq] - 1;
      ++rows.num_rows;
    }
    PD_ISA_DISPATCH(
        AttendRows(rows, c, p.block_tables + seq * p.max_blocks_per_seq, kv_head, scale));
  });
}

void LatentAttention(const OpContext& ctx, const LatentAttentionParams& p) {
  const KvCacheView& c = p.cache;
  const int64_t entry = 2 * c.num_kv_heads * c.head_dim;
  // Tasks: the heads in even splits of at most kMaxAttentionRows, times tiles of consecutive
  // tokens of one sequence (several only when a split leaves room for more rows).
  const int64_t head_splits = (p.num_heads + kMaxAttentionRows - 1) / kMaxAttentionRows;
  const int64_t heads_per_task = (p.num_heads + head_splits - 1) / head_splits;
  const int64_t tokens_per_task = std::max<int64_t>(1, kMaxAttentionRows / heads_per_task);
  auto seq_of = [&](int64_t j) { return p.token_seq != nullptr ? p.token_seq[j] : 0; };
  std::vector<int64_t> tile_begin;
  int64_t macs = 0;
  for (int64_t j = 0; j < p.num_tokens; ++j) {
    if (tile_begin.empty() || j - tile_begin.back() == tokens_per_task ||
        seq_of(j) != seq_of(tile_begin.back())) {
      tile_begin.push_back(j);
    }
    macs += (int64_t{p.positions[j]} + 1) * p.num_heads * entry;
  }
  tile_begin.push_back(p.num_tokens);
  const int64_t num_tasks = (static_cast<int64_t>(tile_begin.size()) - 1) * head_splits;
  const float scale =
      p.scale != 0.0f ? p.scale : static_cast<float>(1.0 / std::sqrt(static_cast<double>(entry)));
  ParallelStrided(ctx, num_tasks, SlotsFor(ctx, macs), [&](int, int64_t task) {
    const int64_t split = task % head_splits;
    const auto tile = static_cast<size_t>(task / head_splits);
    const int64_t h_begin = split * heads_per_task;
    const int64_t h_end = std::min(p.num_heads, h_begin + heads_per_task);
    AttentionRows rows;
    for (int64_t j = tile_begin[tile]; j < tile_begin[tile + 1]; ++j) {
      for (int64_t h = h_begin; h < h_end; ++h) {
        rows.q[rows.num_rows] = p.q + j * p.q_token_stride + h * entry;
        rows.out[rows.num_rows] = p.out + j * p.out_token_stride + h * p.value_dim;
        rows.last_key[rows.num_rows] = p.positions[j];
        ++rows.num_rows;
      }
    }
    const int32_t* table = p.block_tables + seq_of(tile_begin[tile]) * p.max_blocks_per_seq;
    PD_ISA_DISPATCH(AttendLatentRows(rows, c, table, p.value_dim, scale));
  });
}

}  // namespace pd::kernels::cpu
