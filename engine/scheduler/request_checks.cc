#include "engine/scheduler/request_checks.h"

#include <cmath>
#include <cstdint>
#include <string>

#include "absl/strings/str_cat.h"
#include "kernels/logprobs_params.h"

namespace pd::engine {

absl::Status CheckPrompt(const GenerationRequest& request, const ModelConfig& model) {
  const std::string id = request.id.ToString();
  if (request.prompt.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("request ", id, ": empty prompt"));
  }
  for (uint32_t t : request.prompt) {
    if (t >= static_cast<uint32_t>(model.vocab_size)) {
      return absl::InvalidArgumentError(
          absl::StrCat("request ", id, ": token id ", t, " >= vocab size ", model.vocab_size));
    }
  }
  if (static_cast<int64_t>(request.prompt.size()) >= model.seq_len) {
    return absl::InvalidArgumentError(
        absl::StrCat("request ", id, ": prompt of ", request.prompt.size(),
                     " tokens does not fit the context of ", model.seq_len));
  }
  return absl::OkStatus();
}

absl::Status CheckOptions(const GenerationRequest& request, const ModelConfig& model) {
  const std::string id = request.id.ToString();
  const SamplingOptions& so = request.sampling;
  for (uint32_t t : so.forced_tokens) {
    if (t >= static_cast<uint32_t>(model.vocab_size)) {
      return absl::InvalidArgumentError(absl::StrCat("request ", id, ": forced token id ", t,
                                                     " >= vocab size ", model.vocab_size));
    }
  }
  if (std::isnan(so.temperature) || !(so.top_p <= 1.0f)) {
    return absl::InvalidArgumentError(
        absl::StrCat("request ", id, ": temperature ", so.temperature, " and top_p ", so.top_p,
                     " (need a number, and top_p at most 1; 0 means 1)"));
  }
  if (!(so.min_p >= 0.0f && so.min_p <= 1.0f)) {
    return absl::InvalidArgumentError(
        absl::StrCat("request ", id, ": min_p ", so.min_p, " outside [0, 1]"));
  }
  if (!(so.presence_penalty >= -2.0f && so.presence_penalty <= 2.0f) ||
      !(so.frequency_penalty >= -2.0f && so.frequency_penalty <= 2.0f)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "request ", id, ": presence_penalty ", so.presence_penalty, " and frequency_penalty ",
        so.frequency_penalty, " (each must be in [-2, 2])"));
  }
  if (!(so.repetition_penalty > 0.0f) || !std::isfinite(so.repetition_penalty)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "request ", id, ": repetition_penalty ", so.repetition_penalty, " (must be finite, > 0)"));
  }
  for (size_t i = 0; i < so.logit_bias.size(); ++i) {
    const auto [token, bias] = so.logit_bias[i];
    if (token >= static_cast<uint32_t>(model.vocab_size)) {
      return absl::InvalidArgumentError(absl::StrCat("request ", id, ": logit_bias token id ",
                                                     token, " >= vocab size ", model.vocab_size));
    }
    if (!(bias >= -100.0f && bias <= 100.0f)) {
      return absl::InvalidArgumentError(absl::StrCat("request ", id, ": logit_bias of token ",
                                                     token, " is ", bias,
                                                     " (must be in [-100, 100])"));
    }
    if (i > 0 && token <= so.logit_bias[i - 1].first) {
      return absl::InvalidArgumentError(
          absl::StrCat("request ", id, ": logit_bias ids must be unique and ascending (", token,
                       " after ", so.logit_bias[i - 1].first, ")"));
    }
  }
  if (so.logprobs < -1 || so.logprobs > kernels::kMaxTopLogprobs) {
    return absl::InvalidArgumentError(absl::StrCat("request ", id, ": logprobs ", so.logprobs,
                                                   " outside [-1, ", kernels::kMaxTopLogprobs,
                                                   "]"));
  }
  if (so.full_distribution && so.logprobs < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("request ", id, ": full_distribution needs logprobs >= 0"));
  }
  if (so.grammar != nullptr && (!so.forced_tokens.empty() || so.ignore_eos || so.min_tokens > 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "request ", id,
        ": a structured-output constraint cannot be combined with forced tokens, ignore_eos or "
        "min_tokens (the grammar decides where the output ends)"));
  }
  if (request.remote_prefill != nullptr && request.on_prefilled != nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("request ", id, ": remote_prefill and on_prefilled are exclusive"));
  }
  return absl::OkStatus();
}

}  // namespace pd::engine
