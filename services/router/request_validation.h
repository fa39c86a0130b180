// Validation of public GenerateRequests: everything that can be checked before a model or a
// worker is involved. The first violated rule is reported as InvalidArgument naming the field.
//
// Pure functions; thread-safe.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "engine/grammar/constraint.h"
#include "pd/v1/generation.pb.h"

namespace pd::router {

// Most sampling.logit_bias entries a request may carry (OpenAI's limit).
inline constexpr int kMaxLogitBias = 300;

// Limits on request fields (documented in proto/pd/v1/generation.proto). Flags of pd-router.
struct RequestLimits {
  uint32_t max_stop_strings = 16;
  uint32_t max_stop_string_bytes = 256;
  uint32_t max_stop_token_ids = 64;
  uint32_t max_client_request_id_bytes = 128;
  uint32_t max_tenant_bytes = 128;
  uint32_t max_cache_salt_bytes = 256;
  uint32_t max_prompt_bytes = 1 << 20;  // text prompts
  uint32_t max_prompt_tokens = 131072;  // token-id prompts (the model's context bounds further)
  uint32_t max_tokens_limit = 131072;   // upper bound on sampling.max_tokens
  // Choices per request (n): each is a stream of its own (a slot of --max_inflight and of the
  // tenant's --max_streams_per_tenant), so the bound keeps one request from taking them all.
  uint32_t max_n = 16;

  absl::Status Validate() const;
};

// The router's cache of compiled constraints (ValidateGenerateRequest compiles through it, and
// so may others that compile a constraint before a request is validated: the OpenAI front's
// auto tool-call tag). Process-wide, thread-safe.
grammar::GrammarCache* RouterGrammarCache();

absl::Status ValidateGenerateRequest(const pdserve::v1::GenerateRequest& request,
                                     const RequestLimits& limits);

}  // namespace pd::router
