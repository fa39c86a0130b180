// Validation and device dispatch for AttentionMass.
#include "kernels/attention_mass.h"

#include <cstdint>

#include "absl/strings/str_cat.h"
#include "kernels/attention_params.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/dispatch/validate.h"

namespace pd::kernels {

absl::Status AttentionMass(const OpContext& ctx, const AttentionMassParams& p) {
  if (p.q == nullptr || p.k == nullptr || p.mass == nullptr) {
    return absl::InvalidArgumentError("attention_mass: null q, k or mass");
  }
  if (p.num_tokens <= 0 || p.start_pos < 0 || p.num_kv_heads <= 0 || p.head_dim <= 0 ||
      p.head_dim > kMaxAttentionHeadDim) {
    return absl::InvalidArgumentError(absl::StrCat(
        "attention_mass: need num_tokens > 0, start_pos >= 0, num_kv_heads > 0 and head_dim in "
        "(0, ",
        kMaxAttentionHeadDim, "], got ", p.num_tokens, ", ", p.start_pos, ", ", p.num_kv_heads,
        ", ", p.head_dim));
  }
  if (p.num_heads <= 0 || p.num_heads % p.num_kv_heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat("attention_mass: num_heads ", p.num_heads,
                                                   " must be a positive multiple of num_kv_heads ",
                                                   p.num_kv_heads));
  }
  if (p.q_token_stride < p.num_heads * p.head_dim ||
      p.k_token_stride < p.num_kv_heads * p.head_dim) {
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
  if (ctx.device != Device::kCpu) {
    return absl::UnimplementedError(absl::StrCat("attention_mass: not implemented on ",
                                                 dispatch_internal::DeviceName(ctx.device),
                                                 " (the H2O and SnapKV KV policies are CPU-only)"));
  }
  cpu::AttentionMass(ctx, p);
  return absl::OkStatus();
}

}  // namespace pd::kernels
