// Validation and device dispatch for LatentAttention.
#include "kernels/latent_attention.h"

#include <algorithm>
#include <cstdint>
#include <vector>

#include "absl/strings/str_cat.h"
#include "build_config.h"
#include "common/base/status_macros.h"
#include "kernels/attention.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/dispatch/validate.h"
#if PD_WITH_CUDA
#include "kernels/cuda/cuda_backend.h"
#endif

namespace pd::kernels {

using dispatch_internal::Overlaps;
using dispatch_internal::Span;

absl::Status LatentAttention(const OpContext& ctx, const LatentAttentionParams& p) {
  constexpr const char* kOp = "latent_attention";
  if (p.q == nullptr || p.out == nullptr || p.positions == nullptr || p.block_tables == nullptr) {
    return absl::InvalidArgumentError("latent_attention: null q, out, positions or block_tables");
  }
  PD_RETURN_IF_ERROR(dispatch_internal::CheckKvCacheView(kOp, p.cache));
  const KvCacheView& c = p.cache;
  if (p.num_tokens <= 0 || p.num_heads <= 0 || p.num_seqs <= 0 || p.max_blocks_per_seq <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "latent_attention: num_tokens, num_heads, num_seqs and max_blocks_per_seq must be > 0, "
        "got ",
        p.num_tokens, ", ", p.num_heads, ", ", p.num_seqs, ", ", p.max_blocks_per_seq));
  }
  const int64_t entry = 2 * c.num_kv_heads * c.head_dim;
  if (entry > kMaxLatentEntryDim) {
    return absl::InvalidArgumentError(absl::StrCat(
        "latent_attention: an entry of ", entry, " elements (2 x ", c.num_kv_heads, " heads of ",
        c.head_dim, ") is above the ", kMaxLatentEntryDim, " supported"));
  }
  if (p.value_dim <= 0 || p.value_dim > entry) {
    return absl::InvalidArgumentError(absl::StrCat("latent_attention: value_dim ", p.value_dim,
                                                   " outside (0, ", entry, "], the entry"));
  }
  if (p.q_token_stride < p.num_heads * entry || p.out_token_stride < p.num_heads * p.value_dim) {
    return absl::InvalidArgumentError(
        absl::StrCat("latent_attention: strides (q ", p.q_token_stride, ", out ",
                     p.out_token_stride, ") smaller than a token's heads (", p.num_heads * entry,
                     ", ", p.num_heads * p.value_dim, ")"));
  }
  if (Overlaps(p.q, Span(p.num_tokens, p.q_token_stride, p.num_heads * entry) * 4, p.out,
               Span(p.num_tokens, p.out_token_stride, p.num_heads * p.value_dim) * 4)) {
    return absl::InvalidArgumentError("latent_attention: q and out overlap");
  }
  if (!SupportsAttention(ctx.device, c.dtype)) {
    return dispatch_internal::NoBackend(kOp, ctx.device, c.dtype);
  }
#if PD_WITH_CUDA
  if (ctx.device == Device::kCuda) {
    return cuda::LatentAttention(ctx, p);  // positions and tables are device memory: not read here
  }
#endif
  // Every block a query reads: per sequence, the blocks up to its furthest query.
  std::vector<int64_t> furthest(static_cast<size_t>(p.num_seqs), -1);
  for (int64_t j = 0; j < p.num_tokens; ++j) {
    const int64_t seq = p.token_seq != nullptr ? p.token_seq[j] : 0;
    if (seq < 0 || seq >= p.num_seqs) {
      return absl::InvalidArgumentError(absl::StrCat(
          "latent_attention: token ", j, " has sequence ", seq, " outside [0, ", p.num_seqs, ")"));
    }
    const int64_t pos = p.positions[j];
    if (pos < 0 || pos / c.block_size >= p.max_blocks_per_seq) {
      return absl::InvalidArgumentError(absl::StrCat(
          "latent_attention: token ", j, " position ", pos, " outside the block table (",
          p.max_blocks_per_seq, " blocks of ", c.block_size, ")"));
    }
    furthest[static_cast<size_t>(seq)] = std::max(furthest[static_cast<size_t>(seq)], pos);
  }
  for (int64_t s = 0; s < p.num_seqs; ++s) {
    const int64_t pos = furthest[static_cast<size_t>(s)];
    if (pos >= 0) {
      PD_RETURN_IF_ERROR(dispatch_internal::CheckBlockIds(
          kOp, p.block_tables + s * p.max_blocks_per_seq, pos / c.block_size + 1, c.num_blocks));
    }
  }
  cpu::LatentAttention(ctx, p);
  return absl::OkStatus();
}

}  // namespace pd::kernels
