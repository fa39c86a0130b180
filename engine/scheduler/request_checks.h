// What the scheduler checks of a GenerationRequest before queueing it, apart from what depends
// on its own state (KV pool size, sink + window cache, duplicate ids, queue bound). Plain
// functions of the request and the model; every failure is InvalidArgument naming the request
// and the offending value.
#pragma once

#include "absl/status/status.h"
#include "engine/model/model_config.h"
#include "engine/scheduler/request.h"

namespace pd::engine {

// The prompt: non-empty, every id inside the vocabulary, shorter than the context.
absl::Status CheckPrompt(const GenerationRequest& request, const ModelConfig& model);

// The options: forced tokens inside the vocabulary, a temperature that is a number, top_p at
// most 1, min_p in [0, 1], presence and frequency penalties in [-2, 2], a finite repetition
// penalty > 0, logit_bias ids inside the vocabulary (unique, ascending) with biases in
// [-100, 100], logprobs in [-1, kernels::kMaxTopLogprobs], and at most one of the
// disaggregation hooks (remote_prefill, on_prefilled).
absl::Status CheckOptions(const GenerationRequest& request, const ModelConfig& model);

}  // namespace pd::engine
