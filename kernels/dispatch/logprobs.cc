// Validation and device dispatch for LogProbs.
#include "kernels/logprobs.h"

#include <cstdint>
#include <limits>

#include "absl/strings/str_cat.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/dispatch/validate.h"

namespace pd::kernels {

using dispatch_internal::Overlaps;
using dispatch_internal::Span;

bool SupportsLogProbs(Device device) {
  switch (device) {
    case Device::kCpu:
      return true;
    case Device::kCuda:
      return false;  // the scheduler's logits are host memory on every device
  }
  return false;
}

absl::Status LogProbs(const OpContext& ctx, const LogProbsParams& p) {
  if (p.logits == nullptr) {
    return absl::InvalidArgumentError("logprobs: null logits");
  }
  if (p.num_seqs <= 0 || p.vocab_size <= 0 || p.vocab_size > std::numeric_limits<int32_t>::max()) {
    return absl::InvalidArgumentError(
        absl::StrCat("logprobs: need num_seqs > 0 and vocab_size in [1, 2^31), got ", p.num_seqs,
                     ", ", p.vocab_size));
  }
  if (p.logits_stride < p.vocab_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("logprobs: logits_stride ", p.logits_stride, " < vocab_size ", p.vocab_size));
  }
  if (p.top_n < 0 || p.top_n > kMaxTopLogprobs) {
    return absl::InvalidArgumentError(
        absl::StrCat("logprobs: top_n ", p.top_n, " outside [0, ", kMaxTopLogprobs, "]"));
  }
  if ((p.tokens == nullptr) != (p.out_token_logprobs == nullptr)) {
    return absl::InvalidArgumentError(
        "logprobs: tokens and out_token_logprobs must both be set or both be null");
  }
  if (p.top_n > 0 && (p.out_top_ids == nullptr || p.out_top_logprobs == nullptr)) {
    return absl::InvalidArgumentError(
        absl::StrCat("logprobs: top_n ", p.top_n, " needs out_top_ids and out_top_logprobs"));
  }
  const int64_t logits_bytes = Span(p.num_seqs, p.logits_stride, p.vocab_size) * 4;
  const int64_t top_bytes = p.num_seqs * p.top_n * 4;
  if ((p.out_token_logprobs != nullptr &&
       Overlaps(p.out_token_logprobs, p.num_seqs * 4, p.logits, logits_bytes)) ||
      (p.top_n > 0 && (Overlaps(p.out_top_ids, top_bytes, p.logits, logits_bytes) ||
                       Overlaps(p.out_top_logprobs, top_bytes, p.logits, logits_bytes)))) {
    return absl::InvalidArgumentError("logprobs: an output overlaps the logits");
  }
  if (!SupportsLogProbs(ctx.device)) {
    return dispatch_internal::NoBackend("logprobs", ctx.device, DType::kF32);
  }
  if (p.tokens != nullptr) {
    for (int64_t s = 0; s < p.num_seqs; ++s) {
      if (p.tokens[s] < 0 || p.tokens[s] >= p.vocab_size) {
        return absl::InvalidArgumentError(absl::StrCat("logprobs: tokens[", s, "] = ", p.tokens[s],
                                                       " outside [0, ", p.vocab_size, ")"));
      }
    }
  }
  cpu::LogProbs(ctx, p);
  return absl::OkStatus();
}

}  // namespace pd::kernels
