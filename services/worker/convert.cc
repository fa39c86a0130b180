#include "services/worker/convert.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/logprobs_params.h"
#include "services/base/constraint_proto.h"

namespace pd::worker {

absl::StatusOr<engine::SamplingOptions> SamplingFromProto(const pdserve::v1::SamplingParams& p) {
  if (!std::isfinite(p.temperature()) || p.temperature() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("sampling.temperature must be finite and >= 0, got ", p.temperature()));
  }
  if (!std::isfinite(p.top_p()) || p.top_p() < 0 || p.top_p() > 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("sampling.top_p must be in (0, 1] (0 = off), got ", p.top_p()));
  }
  if (p.max_tokens() > 0 && p.min_tokens() > p.max_tokens()) {
    return absl::InvalidArgumentError(
        absl::StrCat("sampling.min_tokens ", p.min_tokens(), " > max_tokens ", p.max_tokens()));
  }
  if (p.top_k() > static_cast<uint32_t>(INT32_MAX)) {
    return absl::InvalidArgumentError(absl::StrCat("sampling.top_k too large: ", p.top_k()));
  }
  if (!(p.min_p() >= 0.0f && p.min_p() <= 1.0f)) {
    return absl::InvalidArgumentError(
        absl::StrCat("sampling.min_p must be in [0, 1], got ", p.min_p()));
  }
  if (!(p.presence_penalty() >= -2.0f && p.presence_penalty() <= 2.0f)) {
    return absl::InvalidArgumentError(
        absl::StrCat("sampling.presence_penalty must be in [-2, 2], got ", p.presence_penalty()));
  }
  if (!(p.frequency_penalty() >= -2.0f && p.frequency_penalty() <= 2.0f)) {
    return absl::InvalidArgumentError(
        absl::StrCat("sampling.frequency_penalty must be in [-2, 2], got ", p.frequency_penalty()));
  }
  if (!std::isfinite(p.repetition_penalty()) || p.repetition_penalty() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("sampling.repetition_penalty must be finite and > 0 (0 = off), got ",
                     p.repetition_penalty()));
  }
  engine::SamplingOptions s;
  for (const auto& [token, bias] : p.logit_bias()) {
    if (!(bias >= -100.0f && bias <= 100.0f)) {
      return absl::InvalidArgumentError(
          absl::StrCat("sampling.logit_bias[", token, "] must be in [-100, 100], got ", bias));
    }
    s.logit_bias.emplace_back(token, bias);
  }
  // A proto map has no order: by id, as the engine wants them (ids are unique keys).
  std::sort(s.logit_bias.begin(), s.logit_bias.end());
  s.presence_penalty = p.presence_penalty();
  s.frequency_penalty = p.frequency_penalty();
  s.repetition_penalty = p.repetition_penalty() > 0 ? p.repetition_penalty() : 1.0f;
  s.min_p = p.min_p();
  s.max_tokens = p.max_tokens();
  s.min_tokens = p.min_tokens();
  s.temperature = p.temperature();
  s.top_p = p.top_p() > 0 ? p.top_p() : 1.0f;
  s.top_k = static_cast<int32_t>(p.top_k());
  s.seed = p.has_seed() ? p.seed() : 0;
  s.stop.assign(p.stop().begin(), p.stop().end());
  s.stop_token_ids.assign(p.stop_token_ids().begin(), p.stop_token_ids().end());
  s.ignore_eos = p.ignore_eos();
  s.no_speculation = p.no_speculation();
  if (p.has_logprobs()) {
    if (p.logprobs() > static_cast<uint32_t>(kernels::kMaxTopLogprobs)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "sampling.logprobs must be in [0, ", kernels::kMaxTopLogprobs, "], got ", p.logprobs()));
    }
    s.logprobs = static_cast<int32_t>(p.logprobs());
  }
  // Structured output: compiled once per distinct constraint in this process (agent traffic
  // repeats a few schemas); the router has already refused bad ones, so errors here are rare.
  static grammar::GrammarCache* const cache = new grammar::GrammarCache(256);
  absl::StatusOr<std::shared_ptr<const grammar::CompiledGrammar>> g =
      services::CompileConstraintOf(p, cache);
  if (!g.ok()) return g.status();
  s.grammar = *std::move(g);
  return s;
}

pdserve::v1::FinishReason FinishReasonToProto(engine::FinishReason reason) {
  switch (reason) {
    case engine::FinishReason::kNone:
      return pdserve::v1::FINISH_REASON_UNSPECIFIED;
    case engine::FinishReason::kStop:
      return pdserve::v1::FINISH_REASON_STOP;
    case engine::FinishReason::kLength:
      return pdserve::v1::FINISH_REASON_LENGTH;
    case engine::FinishReason::kStopString:
      return pdserve::v1::FINISH_REASON_STOP_STRING;
    case engine::FinishReason::kAbort:
      return pdserve::v1::FINISH_REASON_ABORT;
    case engine::FinishReason::kError:
      return pdserve::v1::FINISH_REASON_ERROR;
  }
  return pdserve::v1::FINISH_REASON_ERROR;
}

void TokenLogprobToProto(const engine::TokenLogprob& in, pdserve::v1::TokenLogprob* out) {
  out->set_logprob(in.logprob);
  out->mutable_top()->Reserve(static_cast<int>(in.top.size()));
  for (const auto& [id, lp] : in.top) {
    pdserve::v1::TopLogprob* t = out->add_top();
    t->set_token_id(id);
    t->set_logprob(lp);
  }
}

engine::TokenLogprob TokenLogprobFromProto(const pdserve::v1::TokenLogprob& in) {
  engine::TokenLogprob out;
  out.logprob = in.logprob();
  out.top.reserve(in.top_size());
  for (const pdserve::v1::TopLogprob& t : in.top()) {
    out.top.emplace_back(t.token_id(), t.logprob());
  }
  return out;
}

}  // namespace pd::worker
