// Validation and device dispatch for WriteKv, ReadKv, PrefillAttention and DecodeAttention.
#include "kernels/attention.h"

#include <algorithm>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "build_config.h"
#include "common/base/status_macros.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/dispatch/validate.h"
#if PD_WITH_CUDA
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/launch_config.h"
#endif

namespace pd::kernels {

using dispatch_internal::CheckBlockIds;
using dispatch_internal::CheckKvCacheView;
using dispatch_internal::NoBackend;
using dispatch_internal::Overlaps;
using dispatch_internal::Span;

namespace {

absl::Status CheckHeads(const char* op, int64_t num_heads, const KvCacheView& c) {
  if (num_heads <= 0 || num_heads % c.num_kv_heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": num_heads ", num_heads,
                                                   " must be a positive multiple of num_kv_heads ",
                                                   c.num_kv_heads));
  }
  return absl::OkStatus();
}

absl::Status CheckQueryOut(const char* op, const float* q, int64_t q_stride, float* out,
                           int64_t out_stride, int64_t rows, int64_t row_elems) {
  if (q_stride < row_elems || out_stride < row_elems) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": strides (q ", q_stride, ", out ",
                                                   out_stride, ") < num_heads * head_dim ",
                                                   row_elems));
  }
  if (Overlaps(q, Span(rows, q_stride, row_elems) * 4, out,
               Span(rows, out_stride, row_elems) * 4)) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": q and out overlap"));
  }
  return absl::OkStatus();
}

absl::Status CheckDecodeWorkspace(const OpContext& ctx, const DecodeAttentionParams& p) {
  const int64_t need = DecodeAttentionWorkspaceBytes(ctx, p);
  if (need == 0) {
    return absl::OkStatus();
  }
  if (p.workspace == nullptr || p.workspace_bytes < need) {
    return absl::InvalidArgumentError(absl::StrCat(
        "decode_attention: workspace of ", p.workspace_bytes, " bytes, need ", need, " (",
        p.num_seqs, " sequences x ", p.num_heads, " heads, head_dim ", p.cache.head_dim, ", ",
        p.max_blocks_per_seq, " blocks of ", p.cache.block_size, " tokens per sequence)"));
  }
  if (reinterpret_cast<uintptr_t>(p.workspace) % 4 != 0) {
    return absl::InvalidArgumentError("decode_attention: workspace not 4-byte aligned");
  }
  const int64_t row_elems = p.num_heads * p.cache.head_dim;
  if (Overlaps(p.workspace, need, p.q, Span(p.num_seqs, p.q_seq_stride, row_elems) * 4) ||
      Overlaps(p.workspace, need, p.out, Span(p.num_seqs, p.out_seq_stride, row_elems) * 4)) {
    return absl::InvalidArgumentError("decode_attention: workspace overlaps q or out");
  }
  return absl::OkStatus();
}

}  // namespace

bool SupportsAttention(Device device, DType cache_dtype) {
  if (DTypeName(cache_dtype) == "unknown") {
    return false;
  }
  switch (device) {
    case Device::kCpu:
      return true;  // f32, bf16, f16, i8, fp8 E4M3 and i4 caches
    case Device::kCuda:
      // every dtype (the quantized ones not yet run on a GPU)
      return PD_WITH_CUDA;
  }
  return false;
}

namespace {

// The checks WriteKv and ReadKv share (P is WriteKvParams or ReadKvParams). On kCpu it also
// checks every token's position and block id.
template <typename P>
absl::Status CheckKvRows(const char* op, const OpContext& ctx, const P& p) {
  if (p.k == nullptr || p.v == nullptr || p.positions == nullptr || p.block_tables == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": null k, v, positions or block_tables"));
  }
  PD_RETURN_IF_ERROR(CheckKvCacheView(op, p.cache));
  const KvCacheView& c = p.cache;
  if (p.num_tokens <= 0 || p.num_seqs <= 0 || p.max_blocks_per_seq <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": num_tokens, num_seqs and max_blocks_per_seq must be > 0, got ",
                     p.num_tokens, ", ", p.num_seqs, ", ", p.max_blocks_per_seq));
  }
  const int64_t token_elems = c.num_kv_heads * c.head_dim;
  if (p.k_token_stride < token_elems || p.v_token_stride < token_elems) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": token strides (k ", p.k_token_stride,
                                                   ", v ", p.v_token_stride,
                                                   ") < num_kv_heads * head_dim ", token_elems));
  }
  if (!SupportsAttention(ctx.device, c.dtype)) {
    return NoBackend(op, ctx.device, c.dtype);
  }
  if (ctx.device != Device::kCpu) {
    return absl::OkStatus();  // positions and tables are device memory: not read here
  }
  for (int64_t j = 0; j < p.num_tokens; ++j) {
    const int64_t seq = p.token_seq != nullptr ? p.token_seq[j] : 0;
    if (seq < 0 || seq >= p.num_seqs) {
      return absl::InvalidArgumentError(
          absl::StrCat(op, ": token ", j, " has sequence ", seq, " outside [0, ", p.num_seqs, ")"));
    }
    const int64_t pos = p.positions[j];
    if (pos < 0 || pos / c.block_size >= p.max_blocks_per_seq) {
      return absl::InvalidArgumentError(
          absl::StrCat(op, ": token ", j, " position ", pos, " outside the block table (",
                       p.max_blocks_per_seq, " blocks of ", c.block_size, ")"));
    }
    PD_RETURN_IF_ERROR(CheckBlockIds(
        op, p.block_tables + seq * p.max_blocks_per_seq + pos / c.block_size, 1, c.num_blocks));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status WriteKv(const OpContext& ctx, const WriteKvParams& p) {
  PD_RETURN_IF_ERROR(CheckKvRows("write_kv", ctx, p));
#if PD_WITH_CUDA
  if (ctx.device == Device::kCuda) {
    return cuda::WriteKv(ctx, p);
  }
#endif
  cpu::WriteKv(ctx, p);
  return absl::OkStatus();
}

absl::Status ReadKv(const OpContext& ctx, const ReadKvParams& p) {
  constexpr const char* kOp = "read_kv";
  PD_RETURN_IF_ERROR(CheckKvRows(kOp, ctx, p));
  const int64_t row_elems = p.cache.num_kv_heads * p.cache.head_dim;
  if (Overlaps(p.k, Span(p.num_tokens, p.k_token_stride, row_elems) * 4, p.v,
               Span(p.num_tokens, p.v_token_stride, row_elems) * 4)) {
    return absl::InvalidArgumentError("read_kv: k and v overlap");
  }
#if PD_WITH_CUDA
  if (ctx.device == Device::kCuda) {
    return cuda::ReadKv(ctx, p);  // positions and tables are device memory: not read here
  }
#endif
  cpu::ReadKv(ctx, p);
  return absl::OkStatus();
}

absl::Status GatherKvRows(const OpContext& ctx, const GatherKvRowsParams& p) {
  constexpr const char* kOp = "gather_kv_rows";
  const KvCacheView& c = p.cache;
  PD_RETURN_IF_ERROR(CheckKvCacheView(kOp, c));
  if (p.src_blocks == nullptr || p.dst_blocks == nullptr || p.keep == nullptr) {
    return absl::InvalidArgumentError("gather_kv_rows: null src_blocks, dst_blocks or keep");
  }
  if (p.num_layers <= 0 || p.num_keep <= 0 || p.num_src_blocks <= 0 ||
      p.num_dst_blocks * c.block_size < p.num_keep || p.keep_first_head < 0 ||
      p.keep_heads < p.keep_first_head + c.num_kv_heads) {
    return absl::InvalidArgumentError(absl::StrCat(
        "gather_kv_rows: need num_layers, num_keep and num_src_blocks > 0, num_keep ", p.num_keep,
        " rows within ", p.num_dst_blocks, " dst blocks of ", c.block_size, ", and heads [",
        p.keep_first_head, ", ", p.keep_first_head + c.num_kv_heads, ") within keep's ",
        p.keep_heads, "; got num_layers ", p.num_layers, ", num_src_blocks ", p.num_src_blocks));
  }
  if (!SupportsAttention(ctx.device, c.dtype)) {
    return NoBackend(kOp, ctx.device, c.dtype);
  }
#if PD_WITH_CUDA
  if (ctx.device == Device::kCuda) {
    return cuda::GatherKvRows(ctx, p);  // ids and slots are device memory: not read here
  }
#endif
  PD_RETURN_IF_ERROR(CheckBlockIds(kOp, p.src_blocks, p.num_src_blocks, c.num_blocks));
  PD_RETURN_IF_ERROR(CheckBlockIds(kOp, p.dst_blocks, p.num_dst_blocks, c.num_blocks));
  for (int64_t i = 0; i < p.num_dst_blocks; ++i) {
    if (std::find(p.src_blocks, p.src_blocks + p.num_src_blocks, p.dst_blocks[i]) !=
        p.src_blocks + p.num_src_blocks) {
      return absl::InvalidArgumentError(
          absl::StrCat("gather_kv_rows: block ", p.dst_blocks[i], " is in both src and dst"));
    }
  }
  const int64_t src_slots = p.num_src_blocks * c.block_size;
  const int64_t kept = p.num_layers * p.keep_heads * p.num_keep;
  for (int64_t i = 0; i < kept; ++i) {
    if (p.keep[i] < 0 || p.keep[i] >= src_slots) {
      return absl::InvalidArgumentError(absl::StrCat("gather_kv_rows: kept slot ", p.keep[i],
                                                     " outside the ", src_slots, " source slots"));
    }
  }
  cpu::GatherKvRows(ctx, p);
  return absl::OkStatus();
}

absl::Status PrefillAttention(const OpContext& ctx, const PrefillAttentionParams& p) {
  constexpr const char* kOp = "prefill_attention";
  if (p.q == nullptr || p.out == nullptr || p.block_table == nullptr) {
    return absl::InvalidArgumentError("prefill_attention: null q, out or block_table");
  }
  PD_RETURN_IF_ERROR(CheckKvCacheView(kOp, p.cache));
  PD_RETURN_IF_ERROR(CheckHeads(kOp, p.num_heads, p.cache));
  if (p.num_tokens <= 0 || p.start_pos < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("prefill_attention: need num_tokens > 0 and start_pos >= 0, got ",
                     p.num_tokens, ", ", p.start_pos));
  }
  PD_RETURN_IF_ERROR(CheckQueryOut(kOp, p.q, p.q_token_stride, p.out, p.out_token_stride,
                                   p.num_tokens, p.num_heads * p.cache.head_dim));
  const int64_t blocks = (p.start_pos + p.num_tokens + p.cache.block_size - 1) / p.cache.block_size;
  if (p.num_table_blocks < blocks) {
    return absl::InvalidArgumentError(absl::StrCat(
        "prefill_attention: block table has ", p.num_table_blocks, " blocks, positions up to ",
        p.start_pos + p.num_tokens - 1, " need ", blocks));
  }
  if (!SupportsAttention(ctx.device, p.cache.dtype)) {
    return NoBackend(kOp, ctx.device, p.cache.dtype);
  }
#if PD_WITH_CUDA
  if (ctx.device == Device::kCuda) {
    return cuda::PrefillAttention(ctx, p);  // the block table is device memory: not read here
  }
#endif
  PD_RETURN_IF_ERROR(CheckBlockIds(kOp, p.block_table, blocks, p.cache.num_blocks));
  cpu::PrefillAttention(ctx, p);
  return absl::OkStatus();
}

int64_t DecodeAttentionWorkspaceBytes(const OpContext& ctx, const DecodeAttentionParams& p) {
  if (ctx.device != Device::kCuda || p.num_seqs <= 0 || p.num_heads <= 0 || p.cache.head_dim <= 0 ||
      p.max_blocks_per_seq <= 0 || p.cache.block_size <= 0) {
    return 0;
  }
#if PD_WITH_CUDA
  return cuda::DecodeWorkspaceBytes(p.num_seqs, p.num_heads, p.cache.head_dim, p.max_blocks_per_seq,
                                    p.cache.block_size, p.max_context_len);
#else
  return 0;
#endif
}

absl::Status DecodeAttention(const OpContext& ctx, const DecodeAttentionParams& p) {
  constexpr const char* kOp = "decode_attention";
  if (p.q == nullptr || p.out == nullptr || p.block_tables == nullptr ||
      p.context_lens == nullptr) {
    return absl::InvalidArgumentError(
        "decode_attention: null q, out, block_tables or context_lens");
  }
  PD_RETURN_IF_ERROR(CheckKvCacheView(kOp, p.cache));
  PD_RETURN_IF_ERROR(CheckHeads(kOp, p.num_heads, p.cache));
  if (p.num_seqs <= 0 || p.max_blocks_per_seq <= 0 || p.max_context_len < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "decode_attention: num_seqs and max_blocks_per_seq must be > 0 and max_context_len >= 0, "
        "got ",
        p.num_seqs, ", ", p.max_blocks_per_seq, ", ", p.max_context_len));
  }
  PD_RETURN_IF_ERROR(CheckQueryOut(kOp, p.q, p.q_seq_stride, p.out, p.out_seq_stride, p.num_seqs,
                                   p.num_heads * p.cache.head_dim));
  if (!SupportsAttention(ctx.device, p.cache.dtype)) {
    return NoBackend(kOp, ctx.device, p.cache.dtype);
  }
  PD_RETURN_IF_ERROR(CheckDecodeWorkspace(ctx, p));
#if PD_WITH_CUDA
  if (ctx.device == Device::kCuda) {
    return cuda::DecodeAttention(ctx, p);  // tables and lengths are device memory: not read here
  }
#endif
  const int64_t capacity = p.max_blocks_per_seq * p.cache.block_size;
  for (int64_t s = 0; s < p.num_seqs; ++s) {
    const int64_t len = p.context_lens[s];
    if (len < 1 || len > capacity) {
      return absl::InvalidArgumentError(absl::StrCat("decode_attention: context_lens[", s,
                                                     "] = ", len, " outside [1, ", capacity, "]"));
    }
    PD_RETURN_IF_ERROR(CheckBlockIds(kOp, p.block_tables + s * p.max_blocks_per_seq,
                                     (len + p.cache.block_size - 1) / p.cache.block_size,
                                     p.cache.num_blocks));
  }
  cpu::DecodeAttention(ctx, p);
  return absl::OkStatus();
}

}  // namespace pd::kernels
