// Validation and device dispatch for Rope, and the inverse-frequency table.
#include "kernels/rope.h"

#include <cmath>
#include <numbers>

#include "absl/strings/str_cat.h"
#include "build_config.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/dispatch/validate.h"
#if PD_WITH_CUDA
#include "kernels/cuda/cuda_backend.h"
#endif

namespace pd::kernels {

bool SupportsRope(Device device) {
  switch (device) {
    case Device::kCpu:
      return true;
    case Device::kCuda:
      return PD_WITH_CUDA;
  }
  return false;
}

absl::StatusOr<std::vector<float>> ComputeRopeInvFreq(const RopeFreqConfig& config) {
  if (config.head_dim <= 0 || config.head_dim % 2 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("rope: head_dim must be even and > 0, got ", config.head_dim));
  }
  if (!(config.theta > 1.0)) {
    return absl::InvalidArgumentError(absl::StrCat("rope: theta must be > 1, got ", config.theta));
  }
  const Llama3RopeScaling& s = config.llama3;
  if (s.enabled &&
      (!(s.factor >= 1.0) || !(s.low_freq_factor > 0.0) ||
       !(s.high_freq_factor > s.low_freq_factor) || s.original_max_position_embeddings <= 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("rope: bad llama3 scaling: factor ", s.factor, " low_freq_factor ",
                     s.low_freq_factor, " high_freq_factor ", s.high_freq_factor,
                     " original_max_position_embeddings ", s.original_max_position_embeddings));
  }
  const int64_t half = config.head_dim / 2;
  std::vector<float> inv_freq(half);
  const double old_len = static_cast<double>(s.original_max_position_embeddings);
  const double low_freq_wavelen = old_len / s.low_freq_factor;
  const double high_freq_wavelen = old_len / s.high_freq_factor;
  for (int64_t i = 0; i < half; ++i) {
    double f = std::pow(config.theta,
                        -2.0 * static_cast<double>(i) / static_cast<double>(config.head_dim));
    if (s.enabled) {
      const double wavelen = 2.0 * std::numbers::pi / f;
      if (wavelen > low_freq_wavelen) {
        f /= s.factor;
      } else if (wavelen >= high_freq_wavelen) {
        const double smooth =
            (old_len / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
        f = (1.0 - smooth) * f / s.factor + smooth * f;
      }
    }
    inv_freq[i] = static_cast<float>(f);
  }
  return inv_freq;
}

absl::Status Rope(const OpContext& ctx, const RopeParams& p) {
  if (p.q == nullptr || p.positions == nullptr || p.inv_freq == nullptr ||
      (p.num_kv_heads > 0 && p.k == nullptr)) {
    return absl::InvalidArgumentError("rope: null q, k, positions or inv_freq");
  }
  if (p.num_tokens <= 0 || p.num_heads <= 0 || p.num_kv_heads < 0 || p.head_dim <= 0 ||
      p.head_dim % 2 != 0 || p.head_dim > kMaxRopeHeadDim) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rope: need num_tokens, num_heads > 0, num_kv_heads >= 0, even head_dim in (0, ",
        kMaxRopeHeadDim, "], got ", p.num_tokens, ", ", p.num_heads, ", ", p.num_kv_heads, ", ",
        p.head_dim));
  }
  if (p.q_token_stride < p.num_heads * p.head_dim ||
      (p.num_kv_heads > 0 && p.k_token_stride < p.num_kv_heads * p.head_dim)) {
    return absl::InvalidArgumentError(absl::StrCat("rope: token strides (q ", p.q_token_stride,
                                                   ", k ", p.k_token_stride,
                                                   ") smaller than a token's heads"));
  }
  if (!SupportsRope(ctx.device)) {
    return dispatch_internal::NoBackend("rope", ctx.device, DType::kF32);
  }
#if PD_WITH_CUDA
  if (ctx.device == Device::kCuda) {
    return cuda::Rope(ctx, p);  // positions are device memory: not read here
  }
#endif
  for (int64_t t = 0; t < p.num_tokens; ++t) {
    if (p.positions[t] < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("rope: position of token ", t, " is negative: ", p.positions[t]));
    }
  }
  cpu::Rope(ctx, p);
  return absl::OkStatus();
}

}  // namespace pd::kernels
