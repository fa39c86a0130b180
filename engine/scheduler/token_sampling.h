// How a request's sampling options become what the forward pass samples with, and the
// log-probability entry of a sampled token. Plain functions; thread-safe.
#pragma once

#include <cstdint>

#include "absl/status/statusor.h"
#include "engine/model/llama_forward.h"
#include "engine/scheduler/request.h"

namespace pd::engine {

// The draw for token `step` (0-based, among the request's generated tokens) of a request with
// options `so`: a temperature below kernels::kMinSamplingTemperature is greedy (0), top_p 0
// means 1, and the logits row comes back when the request asked for logprobs.
SampleSpec SampleSpecFor(const SamplingOptions& so, uint64_t step);

// The entry of `token` sampled from one logits row of `vocab` floats ([vocab]), with its
// `top_n` most likely alternatives (kernels::LogProbs). Errors are the kernel's
// (InvalidArgument for a token or top_n out of range).
absl::StatusOr<TokenLogprob> ComputeLogprob(const float* logits, int64_t vocab, int32_t token,
                                            int32_t top_n);

}  // namespace pd::engine
