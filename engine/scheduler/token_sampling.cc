#include "engine/scheduler/token_sampling.h"

#include "common/base/status_macros.h"
#include "kernels/logprobs.h"
#include "kernels/sampling.h"

namespace pd::engine {

SampleSpec SampleSpecFor(const SamplingOptions& so, uint64_t step) {
  SampleSpec sp;
  // Below kernels::kMinSamplingTemperature (1e-5, subnormals included) is greedy, as 0.
  sp.temperature = kernels::IsGreedyTemperature(so.temperature) ? 0.0f : so.temperature;
  sp.top_k = so.top_k;
  sp.top_p = so.top_p > 0 ? so.top_p : 1.0f;
  sp.seed = so.seed;
  sp.step = step;
  sp.want_logits = so.logprobs >= 0;
  return sp;
}

absl::StatusOr<TokenLogprob> ComputeLogprob(const float* logits, int64_t vocab, int32_t token,
                                            int32_t top_n) {
  float token_logprob = 0.0f;
  int32_t ids[kernels::kMaxTopLogprobs];
  float logprobs[kernels::kMaxTopLogprobs];
  kernels::LogProbsParams p;
  p.logits = logits;
  p.num_seqs = 1;
  p.vocab_size = vocab;
  p.logits_stride = vocab;
  p.tokens = &token;
  p.out_token_logprobs = &token_logprob;
  p.top_n = top_n;
  p.out_top_ids = ids;
  p.out_top_logprobs = logprobs;
  PD_RETURN_IF_ERROR(kernels::LogProbs(kernels::OpContext{}, p));
  TokenLogprob out;
  out.logprob = token_logprob;
  for (int32_t j = 0; j < top_n && ids[j] >= 0; ++j) {
    out.top.emplace_back(static_cast<uint32_t>(ids[j]), logprobs[j]);
  }
  return out;
}

}  // namespace pd::engine
