#include "services/router/request_validation.h"

#include <cmath>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "common/utf8/utf8.h"
#include "services/base/constraint_proto.h"

namespace pd::router {
namespace {

absl::Status Invalid(absl::string_view field, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", why));
}

absl::Status ValidateSampling(const pdserve::v1::SamplingParams& s, const RequestLimits& limits) {
  if (s.max_tokens() > limits.max_tokens_limit) {
    return Invalid("sampling.max_tokens",
                   absl::StrCat(s.max_tokens(), " exceeds the limit ", limits.max_tokens_limit));
  }
  if (s.max_tokens() > 0 && s.min_tokens() > s.max_tokens()) {
    return Invalid("sampling.min_tokens",
                   absl::StrCat(s.min_tokens(), " > max_tokens ", s.max_tokens()));
  }
  if (!std::isfinite(s.temperature()) || s.temperature() < 0) {
    return Invalid("sampling.temperature",
                   absl::StrCat("must be finite and >= 0, got ", s.temperature()));
  }
  if (!std::isfinite(s.top_p()) || s.top_p() < 0 || s.top_p() > 1) {
    return Invalid("sampling.top_p",
                   absl::StrCat("must be in (0, 1] (0 = unset), got ", s.top_p()));
  }
  // The engine's top_k is an int32 (the worker rejects larger values): refuse them here, before
  // a worker is involved.
  if (s.top_k() > static_cast<uint32_t>(INT32_MAX)) {
    return Invalid("sampling.top_k", absl::StrCat(s.top_k(), " exceeds ", INT32_MAX));
  }
  if (!(s.min_p() >= 0.0f && s.min_p() <= 1.0f)) {
    return Invalid("sampling.min_p", absl::StrCat("must be in [0, 1], got ", s.min_p()));
  }
  if (!(s.presence_penalty() >= -2.0f && s.presence_penalty() <= 2.0f)) {
    return Invalid("sampling.presence_penalty",
                   absl::StrCat("must be in [-2, 2], got ", s.presence_penalty()));
  }
  if (!(s.frequency_penalty() >= -2.0f && s.frequency_penalty() <= 2.0f)) {
    return Invalid("sampling.frequency_penalty",
                   absl::StrCat("must be in [-2, 2], got ", s.frequency_penalty()));
  }
  if (!std::isfinite(s.repetition_penalty()) || s.repetition_penalty() < 0) {
    return Invalid(
        "sampling.repetition_penalty",
        absl::StrCat("must be finite and > 0 (0 = unset = 1), got ", s.repetition_penalty()));
  }
  if (s.logit_bias_size() > kMaxLogitBias) {
    return Invalid("sampling.logit_bias",
                   absl::StrCat(s.logit_bias_size(), " entries exceed the limit ", kMaxLogitBias));
  }
  for (const auto& [token, bias] : s.logit_bias()) {
    if (!(bias >= -100.0f && bias <= 100.0f)) {
      return Invalid(absl::StrCat("sampling.logit_bias[", token, "]"),
                     absl::StrCat("must be in [-100, 100], got ", bias));
    }
  }
  // The engine's bound (kernels::kMaxTopLogprobs, OpenAI's top_logprobs limit); refused here
  // so that the client hears it from the router, not from a worker.
  constexpr uint32_t kMaxLogprobs = 20;
  if (s.has_logprobs() && s.logprobs() > kMaxLogprobs) {
    return Invalid("sampling.logprobs",
                   absl::StrCat("must be in [0, ", kMaxLogprobs, "], got ", s.logprobs()));
  }
  if (static_cast<uint32_t>(s.stop_size()) > limits.max_stop_strings) {
    return Invalid("sampling.stop", absl::StrCat(s.stop_size(), " entries exceed the limit ",
                                                 limits.max_stop_strings));
  }
  for (int i = 0; i < s.stop_size(); ++i) {
    const std::string& stop = s.stop(i);
    const std::string field = absl::StrCat("sampling.stop[", i, "]");
    if (stop.empty() || stop.size() > limits.max_stop_string_bytes) {
      return Invalid(field, absl::StrCat("must be 1..", limits.max_stop_string_bytes,
                                         " bytes, got ", stop.size()));
    }
    if (!utf8::IsValid(stop)) {
      return Invalid(field, "is not valid UTF-8");
    }
  }
  if (static_cast<uint32_t>(s.stop_token_ids_size()) > limits.max_stop_token_ids) {
    return Invalid("sampling.stop_token_ids",
                   absl::StrCat(s.stop_token_ids_size(), " entries exceed the limit ",
                                limits.max_stop_token_ids));
  }
  if (s.has_constraint()) {
    // Compiled here so that a constraint the engine cannot enforce is refused before any
    // worker sees it (the compiled grammar is cached: the workers compile the same text).
    absl::StatusOr<std::shared_ptr<const grammar::CompiledGrammar>> g =
        services::CompileConstraintOf(s, RouterGrammarCache());
    if (!g.ok()) return g.status();
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status RequestLimits::Validate() const {
  if (max_prompt_bytes == 0 || max_prompt_tokens == 0 || max_tokens_limit == 0) {
    return absl::InvalidArgumentError(
        "request limits: max_prompt_bytes, max_prompt_tokens and max_tokens_limit must be > 0");
  }
  return absl::OkStatus();
}

grammar::GrammarCache* RouterGrammarCache() {
  static grammar::GrammarCache* const cache = new grammar::GrammarCache(256);
  return cache;
}

absl::Status ValidateGenerateRequest(const pdserve::v1::GenerateRequest& request,
                                     const RequestLimits& limits) {
  using pdserve::v1::GenerateRequest;
  switch (request.prompt_case()) {
    case GenerateRequest::kText:
      if (request.text().empty()) {
        return Invalid("text", "prompt is empty");
      }
      if (request.text().size() > limits.max_prompt_bytes) {
        return Invalid("text", absl::StrCat(request.text().size(), " bytes exceed the limit ",
                                            limits.max_prompt_bytes));
      }
      if (!utf8::IsValid(request.text())) {
        return Invalid("text", "is not valid UTF-8");
      }
      break;
    case GenerateRequest::kTokenIds:
      if (request.token_ids().ids_size() == 0) {
        return Invalid("token_ids", "prompt is empty");
      }
      if (static_cast<uint32_t>(request.token_ids().ids_size()) > limits.max_prompt_tokens) {
        return Invalid("token_ids",
                       absl::StrCat(request.token_ids().ids_size(), " tokens exceed the limit ",
                                    limits.max_prompt_tokens));
      }
      break;
    case GenerateRequest::PROMPT_NOT_SET:
      return Invalid("prompt", "set exactly one of text or token_ids");
  }
  // The text fields are `bytes` on the wire (so invalid UTF-8 gets here instead of failing the
  // parse with an opaque status): each must be UTF-8.
  if (!utf8::IsValid(request.model())) {
    return Invalid("model", "is not valid UTF-8");
  }
  if (!utf8::IsValid(request.client_request_id())) {
    return Invalid("client_request_id", "is not valid UTF-8");
  }
  if (request.has_tenant() && !utf8::IsValid(request.tenant())) {
    return Invalid("tenant", "is not valid UTF-8");
  }
  if (request.has_cache_salt() && !utf8::IsValid(request.cache_salt())) {
    return Invalid("cache_salt", "is not valid UTF-8");
  }
  if (request.n() > limits.max_n) {
    return Invalid("n", absl::StrCat("must be in [1, ", limits.max_n, "] (0 = 1), got ",
                                     request.n()));
  }
  if (request.client_request_id().size() > limits.max_client_request_id_bytes) {
    return Invalid("client_request_id",
                   absl::StrCat(request.client_request_id().size(), " bytes exceed the limit ",
                                limits.max_client_request_id_bytes));
  }
  if (request.has_tenant() &&
      (request.tenant().empty() || request.tenant().size() > limits.max_tenant_bytes)) {
    return Invalid("tenant", absl::StrCat("must be 1..", limits.max_tenant_bytes,
                                          " bytes when set, got ", request.tenant().size()));
  }
  if (request.has_cache_salt() &&
      (request.cache_salt().empty() || request.cache_salt().size() > limits.max_cache_salt_bytes)) {
    return Invalid("cache_salt",
                   absl::StrCat("must be 1..", limits.max_cache_salt_bytes, " bytes when set, got ",
                                request.cache_salt().size()));
  }
  return ValidateSampling(request.sampling(), limits);
}

}  // namespace pd::router
