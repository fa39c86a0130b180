// Validation and device dispatch for Sample.
#include "kernels/sampling.h"

#include <cmath>
#include <cstdint>
#include <limits>

#include "absl/strings/str_cat.h"
#include "build_config.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/dispatch/validate.h"
#if PD_WITH_CUDA
#include "kernels/cuda/cuda_backend.h"
#endif

namespace pd::kernels {

bool SupportsSample(Device device) {
  switch (device) {
    case Device::kCpu:
      return true;
    case Device::kCuda:
      return PD_WITH_CUDA;
  }
  return false;
}

int64_t SamplingWorkspaceBytes(const OpContext& ctx, const SamplingParams& p) {
  return ctx.device == Device::kCpu ? cpu::SamplingWorkspaceBytes(ctx, p) : 0;
}

absl::Status Sample(const OpContext& ctx, const SamplingParams& p) {
  if (p.logits == nullptr || p.out_tokens == nullptr) {
    return absl::InvalidArgumentError("sample: null logits or out_tokens");
  }
  if (p.num_seqs <= 0 || p.vocab_size <= 0 || p.vocab_size > std::numeric_limits<int32_t>::max()) {
    return absl::InvalidArgumentError(
        absl::StrCat("sample: need num_seqs > 0 and vocab_size in [1, 2^31), got ", p.num_seqs,
                     ", ", p.vocab_size));
  }
  if (p.logits_stride < p.vocab_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("sample: logits_stride ", p.logits_stride, " < vocab_size ", p.vocab_size));
  }
  if (!SupportsSample(ctx.device)) {
    return dispatch_internal::NoBackend("sample", ctx.device, DType::kF32);
  }
#if PD_WITH_CUDA
  if (ctx.device == Device::kCuda) {
    // The per-row arrays are device memory: not read here. Which rows sample is unknown on the
    // host, so temperatures need seeds and steps on every row. The kernel treats a NaN
    // temperature as greedy; the caller guarantees top_p in (0, 1] and min_p in [0, 1]. No
    // workspace.
    if (p.temperature != nullptr && (p.seeds == nullptr || p.steps == nullptr)) {
      return absl::InvalidArgumentError(
          "sample: on cuda, temperature needs seeds and steps (rows are not inspected)");
    }
    if (p.vocab_size >= (int64_t{1} << 27)) {  // cuda::kMaxSamplingVocab: fixed-point sums
      return absl::InvalidArgumentError(absl::StrCat("sample: on cuda, vocab_size ", p.vocab_size,
                                                     " must be below 2^27 (134217728)"));
    }
    return cuda::Sample(ctx, p);
  }
#endif
  if (p.temperature != nullptr) {
    for (int64_t s = 0; s < p.num_seqs; ++s) {
      if (std::isnan(p.temperature[s])) {
        return absl::InvalidArgumentError(absl::StrCat("sample: temperature[", s, "] is NaN"));
      }
      if (IsGreedyTemperature(p.temperature[s])) {
        continue;  // greedy row (below kMinSamplingTemperature): the rest is unused
      }
      if (p.seeds == nullptr || p.steps == nullptr) {
        return absl::InvalidArgumentError(absl::StrCat("sample: row ", s, " samples (temperature ",
                                                       p.temperature[s],
                                                       ") but seeds or steps is null"));
      }
      if (p.top_p != nullptr && !(p.top_p[s] > 0.0f && p.top_p[s] <= 1.0f)) {
        return absl::InvalidArgumentError(
            absl::StrCat("sample: top_p[", s, "] = ", p.top_p[s], " outside (0, 1]"));
      }
      if (p.min_p != nullptr && !(p.min_p[s] >= 0.0f && p.min_p[s] <= 1.0f)) {
        return absl::InvalidArgumentError(
            absl::StrCat("sample: min_p[", s, "] = ", p.min_p[s], " outside [0, 1]"));
      }
    }
  }
  const int64_t need = SamplingWorkspaceBytes(ctx, p);
  if (need > 0 && (p.workspace == nullptr || p.workspace_bytes < need)) {
    return absl::InvalidArgumentError(
        absl::StrCat("sample: workspace of ", p.workspace_bytes, " bytes, need ", need));
  }
  cpu::Sample(ctx, p);
  return absl::OkStatus();
}

absl::Status ApplyTokenMask(const OpContext& ctx, const TokenMaskParams& p) {
  if (p.logits == nullptr || p.mask == nullptr) {
    return absl::InvalidArgumentError("token_mask: null logits or mask");
  }
  if (p.num_seqs <= 0 || p.vocab_size <= 0 || p.vocab_size > std::numeric_limits<int32_t>::max() ||
      p.logits_stride < p.vocab_size || p.mask_stride_words < (p.vocab_size + 31) / 32) {
    return absl::InvalidArgumentError(absl::StrCat(
        "token_mask: need num_seqs > 0, vocab_size in [1, 2^31), logits_stride >= vocab_size and "
        "mask_stride_words >= (vocab_size + 31) / 32, got ",
        p.num_seqs, ", ", p.vocab_size, ", ", p.logits_stride, ", ", p.mask_stride_words));
  }
  if (!SupportsSample(ctx.device)) {
    return dispatch_internal::NoBackend("token_mask", ctx.device, DType::kF32);
  }
#if PD_WITH_CUDA
  if (ctx.device == Device::kCuda) {
    return cuda::ApplyTokenMask(ctx, p);
  }
#endif
  cpu::ApplyTokenMask(ctx, p);
  return absl::OkStatus();
}

absl::Status ApplyLogitEdits(const OpContext& ctx, const LogitEditParams& p) {
  if (p.num_edits == 0) {
    return absl::OkStatus();
  }
  if (p.logits == nullptr || p.edits == nullptr || p.rows == nullptr) {
    return absl::InvalidArgumentError("logit_edits: null logits, edits or rows");
  }
  if (p.num_edits < 0 || p.num_seqs <= 0 || p.vocab_size <= 0 ||
      p.vocab_size > std::numeric_limits<int32_t>::max() || p.logits_stride < p.vocab_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("logit_edits: need num_edits >= 0, num_seqs > 0, vocab_size in [1, 2^31) and "
                     "logits_stride >= vocab_size, got ",
                     p.num_edits, ", ", p.num_seqs, ", ", p.vocab_size, ", ", p.logits_stride));
  }
  if (!SupportsSample(ctx.device)) {
    return dispatch_internal::NoBackend("logit_edits", ctx.device, DType::kF32);
  }
#if PD_WITH_CUDA
  if (ctx.device == Device::kCuda) {
    return cuda::ApplyLogitEdits(ctx, p);  // ids are device memory: the caller's to check
  }
#endif
  for (int64_t i = 0; i < p.num_edits; ++i) {
    if (p.rows[i] < 0 || p.rows[i] >= p.num_seqs || p.edits[i].token < 0 ||
        p.edits[i].token >= p.vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat(
          "logit_edits: edit ", i, " names row ", p.rows[i], " and token ", p.edits[i].token, " (",
          p.num_seqs, " rows, vocab_size ", p.vocab_size, ")"));
    }
  }
  cpu::ApplyLogitEdits(ctx, p);
  return absl::OkStatus();
}

}  // namespace pd::kernels
