// Validation and device dispatch for AttentionMass.
#include "kernels/attention_mass.h"

#include <cstdint>

#include "absl/strings/str_cat.h"
#include "build_config.h"
#include "common/base/status_macros.h"
#include "kernels/attention.h"
#include "kernels/attention_params.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/dispatch/validate.h"
#include "kernels/latent_attention_params.h"
#if PD_WITH_CUDA
#include "kernels/cuda/cuda_backend.h"
#endif

namespace pd::kernels {

absl::Status AttentionMass(const OpContext& ctx, const AttentionMassParams& p) {
  if (p.q == nullptr || p.mass == nullptr) {
    return absl::InvalidArgumentError("attention_mass: null q or mass");
  }
  if (p.k == nullptr && (p.cache == nullptr || p.block_table == nullptr)) {
    return absl::InvalidArgumentError(
        "attention_mass: no keys: k, or a cache view and a block table to read them from");
  }
  const int64_t max_dim = p.latent ? kMaxLatentEntryDim : kMaxAttentionHeadDim;
  if (p.num_tokens <= 0 || p.start_pos < 0 || p.num_kv_heads <= 0 || p.head_dim <= 0 ||
      p.head_dim > max_dim) {
    return absl::InvalidArgumentError(absl::StrCat(
        "attention_mass: need num_tokens > 0, start_pos >= 0, num_kv_heads > 0 and head_dim in "
        "(0, ",
        max_dim, "], got ", p.num_tokens, ", ", p.start_pos, ", ", p.num_kv_heads, ", ",
        p.head_dim));
  }
  if (p.latent && (p.k != nullptr || p.num_kv_heads != 1)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "attention_mass: latent keys come from a cache, as one kv head (got ",
        p.k != nullptr ? "f32 rows" : "a cache", " and ", p.num_kv_heads, " kv heads)"));
  }
  if (p.num_heads <= 0 || p.num_heads % p.num_kv_heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat("attention_mass: num_heads ", p.num_heads,
                                                   " must be a positive multiple of num_kv_heads ",
                                                   p.num_kv_heads));
  }
  if (p.q_token_stride < p.num_heads * p.head_dim ||
      (p.k != nullptr && p.k_token_stride < p.num_kv_heads * p.head_dim)) {
    return absl::InvalidArgumentError(
        absl::StrCat("attention_mass: strides (q ", p.q_token_stride, ", k ", p.k_token_stride,
                     ") smaller than a token's heads (", p.num_heads * p.head_dim, ", ",
                     p.num_kv_heads * p.head_dim, ")"));
  }
  if (p.mass_head_stride < p.start_pos + p.num_tokens) {
    return absl::InvalidArgumentError(
        absl::StrCat("attention_mass: mass_head_stride ", p.mass_head_stride, " < the ",
                     p.start_pos + p.num_tokens, " keys the last query attends"));
  }
  if (ctx.device != Device::kCpu && (ctx.device != Device::kCuda || !PD_WITH_CUDA)) {
    return absl::UnimplementedError(absl::StrCat("attention_mass: not implemented on ",
                                                 dispatch_internal::DeviceName(ctx.device),
                                                 PD_WITH_CUDA ? "" : " (built without CUDA)"));
  }
  if (ctx.device == Device::kCuda && p.workspace == nullptr) {
    return absl::InvalidArgumentError(
        "attention_mass: kCuda needs a workspace of AttentionMassWorkspaceFloats floats");
  }
  if (p.k == nullptr) {
    // Keys from the cache: its geometry must be the call's, and every block the keys lie in
    // (slots [0, start_pos + num_tokens)) a block of the pool.
    constexpr const char* kOp = "attention_mass";
    const KvCacheView& c = *p.cache;
    PD_RETURN_IF_ERROR(dispatch_internal::CheckKvCacheView(kOp, c));
    if (p.latent && 2 * c.num_kv_heads * c.head_dim != p.head_dim) {
      return absl::InvalidArgumentError(absl::StrCat(
          "attention_mass: the cache's latent entry is ", 2 * c.num_kv_heads * c.head_dim,
          " elements (K and V rows of ", c.num_kv_heads, " heads of ", c.head_dim,
          "), the call's head_dim ", p.head_dim));
    }
    if (!p.latent && (c.num_kv_heads != p.num_kv_heads || c.head_dim != p.head_dim)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "attention_mass: the cache's ", c.num_kv_heads, " kv heads of ", c.head_dim,
          " differ from the call's ", p.num_kv_heads, " of ", p.head_dim));
    }
    if (!SupportsAttention(ctx.device, c.dtype)) {
      return dispatch_internal::NoBackend(kOp, ctx.device, c.dtype);
    }
    const int64_t blocks = (p.start_pos + p.num_tokens + c.block_size - 1) / c.block_size;
    if (blocks > p.num_table_blocks) {
      return absl::InvalidArgumentError(
          absl::StrCat("attention_mass: ", p.start_pos + p.num_tokens, " keys need ", blocks,
                       " blocks, the table has ", p.num_table_blocks));
    }
    if (ctx.device == Device::kCpu) {  // kCuda: device memory, not read here
      PD_RETURN_IF_ERROR(
          dispatch_internal::CheckBlockIds(kOp, p.block_table, blocks, c.num_blocks));
    }
  }
#if PD_WITH_CUDA
  if (ctx.device == Device::kCuda) {
    return cuda::AttentionMass(ctx, p);
  }
#endif
  cpu::AttentionMass(ctx, p);
  return absl::OkStatus();
}

}  // namespace pd::kernels
