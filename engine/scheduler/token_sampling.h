// How a request's sampling options become what the forward pass samples with (the spec, and the
// logit edits of its bias and penalties), and the log-probability entry of a sampled token.
// Plain functions and a per-request builder; see each for thread-safety.
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "engine/model/llama_forward.h"
#include "engine/scheduler/request.h"
#include "kernels/sampling_params.h"

namespace pd::engine {

// The draw for token `step` (0-based, among the request's generated tokens) of a request with
// options `so`: a temperature below kernels::kMinSamplingTemperature is greedy (0), top_p 0
// means 1, and the logits row comes back when the request asked for logprobs. The spec has no
// edits: the caller adds LogitEditBuilder's (HasLogitEdits).
SampleSpec SampleSpecFor(const SamplingOptions& so, uint64_t step);

// Whether `so` changes logits before sampling: a logit_bias entry, or a presence, frequency
// or repetition penalty other than its no-op value (0, 0, 1). False = no edits, no cost.
bool HasLogitEdits(const SamplingOptions& so);

// The logit edits of one request's next token (kernels::LogitEdit: its logit_bias and its
// penalties), derived only from the options and the request's tokens (prompt, then generated
// ones), so every worker that holds the same tokens builds the same edits: the prefill worker
// for the first token, the decode worker after a preemption, a resumed (migrated) request. The
// output's token counts are kept incrementally between calls; a token list that is not an
// extension of the previous call's is recounted from scratch.
//
// Thread-compatible: one per request, used by the scheduler thread.
class LogitEditBuilder {
 public:
  // Edits for the token after `tokens`, whose first `prompt_len` are the prompt: one per token
  // id with a bias or a penalty that applies (a bias entry; with repetition_penalty != 1 every
  // token of the prompt or of the output; with a presence or frequency penalty every token of
  // the output), at most one per id, in no particular order (edits of distinct ids commute).
  // Valid until the next call.
  absl::Span<const kernels::LogitEdit> Build(const SamplingOptions& so,
                                             absl::Span<const uint32_t> tokens, size_t prompt_len);

 private:
  // Catches the counts up with `tokens`.
  void Count(absl::Span<const uint32_t> tokens, size_t prompt_len, bool need_prompt);
  // The edit of `token` in edits_, added (neutral) if it has none yet.
  kernels::LogitEdit& EditOf(uint32_t token);

  size_t prompt_len_ = 0;
  bool prompt_counted_ = false;
  std::vector<uint32_t> prompt_tokens_;  // distinct prompt ids (with a repetition penalty)
  // The counted tokens of the output, to tell an extension from a changed list.
  std::vector<uint32_t> output_;
  absl::flat_hash_map<uint32_t, int32_t> output_counts_;  // id -> occurrences in the output
  absl::flat_hash_map<uint32_t, size_t> index_;           // id -> its edit in edits_ (Build)
  std::vector<kernels::LogitEdit> edits_;
};

// The entry of `token` sampled from one logits row of `vocab` floats ([vocab]), with its
// `top_n` most likely alternatives (kernels::LogProbs), and with `all` every token's logprob
// (TokenLogprob::all). Errors are the kernel's (InvalidArgument for a token or top_n out of
// range).
absl::StatusOr<TokenLogprob> ComputeLogprob(const float* logits, int64_t vocab, int32_t token,
                                            int32_t top_n, bool all = false);

}  // namespace pd::engine
