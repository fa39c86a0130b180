#include "engine/scheduler/token_sampling.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

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
  sp.min_p = so.min_p;
  sp.seed = so.seed;
  sp.step = step;
  sp.want_logits = so.logprobs >= 0;
  return sp;
}

bool HasLogitEdits(const SamplingOptions& so) {
  return !so.logit_bias.empty() || so.presence_penalty != 0.0f || so.frequency_penalty != 0.0f ||
         so.repetition_penalty != 1.0f;
}

void LogitEditBuilder::Count(absl::Span<const uint32_t> tokens, size_t prompt_len,
                             bool need_prompt) {
  const absl::Span<const uint32_t> output = tokens.subspan(prompt_len);
  // An extension of what was counted (the usual case: one token more) only adds; anything
  // else (never seen today) starts over.
  const bool extends = prompt_len == prompt_len_ && output.size() >= output_.size() &&
                       std::equal(output_.begin(), output_.end(), output.begin());
  if (!extends) {
    prompt_len_ = prompt_len;
    prompt_counted_ = false;
    prompt_tokens_.clear();
    output_.clear();
    output_counts_.clear();
  }
  if (need_prompt && !prompt_counted_) {
    prompt_tokens_.assign(tokens.begin(), tokens.begin() + prompt_len);
    std::sort(prompt_tokens_.begin(), prompt_tokens_.end());
    prompt_tokens_.erase(std::unique(prompt_tokens_.begin(), prompt_tokens_.end()),
                         prompt_tokens_.end());
    prompt_counted_ = true;
  }
  for (size_t i = output_.size(); i < output.size(); ++i) {
    ++output_counts_[output[i]];
  }
  output_.assign(output.begin(), output.end());
}

kernels::LogitEdit& LogitEditBuilder::EditOf(uint32_t token) {
  auto [it, added] = index_.try_emplace(token, edits_.size());
  if (added) {
    kernels::LogitEdit e;
    e.token = static_cast<int32_t>(token);
    edits_.push_back(e);
  }
  return edits_[it->second];
}

absl::Span<const kernels::LogitEdit> LogitEditBuilder::Build(const SamplingOptions& so,
                                                             absl::Span<const uint32_t> tokens,
                                                             size_t prompt_len) {
  edits_.clear();
  index_.clear();
  if (!HasLogitEdits(so)) {
    return {};
  }
  const bool repetition = so.repetition_penalty != 1.0f;
  const bool counts = repetition || so.presence_penalty != 0.0f || so.frequency_penalty != 0.0f;
  if (counts) {
    Count(tokens, prompt_len, repetition);
  }
  for (const auto& [token, bias] : so.logit_bias) {
    EditOf(token).bias = bias;
  }
  if (repetition) {
    for (uint32_t token : prompt_tokens_) {
      EditOf(token).repetition = so.repetition_penalty;
    }
  }
  if (counts) {
    for (const auto& [token, count] : output_counts_) {
      kernels::LogitEdit& e = EditOf(token);
      if (repetition) {
        e.repetition = so.repetition_penalty;
      }
      // float32 products, as PyTorch's frequency_penalty * counts (vLLM's apply_penalties).
      e.frequency = so.frequency_penalty * static_cast<float>(count);
      e.presence = so.presence_penalty;
    }
  }
  return edits_;
}

absl::StatusOr<TokenLogprob> ComputeLogprob(const float* logits, int64_t vocab, int32_t token,
                                            int32_t top_n, bool all) {
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
  if (all) {
    // log_softmax, in double (the top entries' arithmetic is the kernel's; these agree with
    // them to float rounding). A NaN logit has logprob -inf, as in the kernel.
    double max = -std::numeric_limits<double>::infinity();
    for (int64_t i = 0; i < vocab; ++i) {
      if (!std::isnan(logits[i])) max = std::max(max, static_cast<double>(logits[i]));
    }
    double sum = 0;
    for (int64_t i = 0; i < vocab; ++i) {
      if (!std::isnan(logits[i])) sum += std::exp(static_cast<double>(logits[i]) - max);
    }
    const double log_sum = max + std::log(sum);
    out.all.resize(static_cast<size_t>(vocab));
    for (int64_t i = 0; i < vocab; ++i) {
      out.all[static_cast<size_t>(i)] =
          std::isnan(logits[i]) ? -std::numeric_limits<float>::infinity()
                                : static_cast<float>(static_cast<double>(logits[i]) - log_sum);
    }
  }
  return out;
}

}  // namespace pd::engine
