// LogProbs: log-probabilities of the sampled tokens and the top-N alternatives per logits row.
// Validates once, then runs the implementation registered for ctx.device. See
// kernels/logprobs_params.h for the exact rule (raw distribution, non-finite logits, ties).
#pragma once

#include "absl/status/status.h"
#include "kernels/logprobs_params.h"

namespace pd::kernels {

// Errors: InvalidArgument for null logits, non-positive sizes, a vocab_size of 2^31 or more,
// logits_stride < vocab_size, top_n outside [0, kMaxTopLogprobs], exactly one of tokens and
// out_token_logprobs null, null alternative outputs with top_n > 0, an output overlapping the
// logits, or a token outside [0, vocab_size); Unimplemented when no backend built for
// ctx.device exists (today only kCpu: the scheduler samples from host logits on every device).
// Needs no workspace.
absl::Status LogProbs(const OpContext& ctx, const LogProbsParams& p);

bool SupportsLogProbs(Device device);

}  // namespace pd::kernels
