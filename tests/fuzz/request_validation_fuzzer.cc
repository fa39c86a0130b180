// Fuzzes the public request validation (services/router/request_validation.h) on a
// GenerateRequest parsed from the input (protobuf wire format, as gRPC delivers it).
//
// Oracle: the rules documented in proto/pd/v1/generation.proto and RequestLimits, re-stated
// here independently, must give the same accept / reject as ValidateGenerateRequest, under the
// default limits and under tiny ones; rejections are InvalidArgument. "Well-formed UTF-8" is
// common/utf8's (unit-tested there, and against a reference by convert_fuzzer). A request the
// router accepts must also be accepted by the worker's conversion of its sampling parameters
// (services/worker/convert.h), since the router forwards them unchanged.
#include <cmath>
#include <cstdint>
#include <string>

#include "absl/strings/match.h"
#include "common/utf8/utf8.h"
#include "google/protobuf/stubs/logging.h"
#include "pd/v1/generation.pb.h"
#include "services/router/request_validation.h"
#include "services/worker/convert.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

using pd::router::RequestLimits;
using pdserve::v1::GenerateRequest;

bool RefValid(const GenerateRequest& r, const RequestLimits& l) {
  switch (r.prompt_case()) {
    case GenerateRequest::kText:
      if (r.text().empty() || r.text().size() > l.max_prompt_bytes ||
          !pd::utf8::IsValid(r.text())) {
        return false;
      }
      break;
    case GenerateRequest::kTokenIds:
      if (r.token_ids().ids().empty() ||
          static_cast<uint64_t>(r.token_ids().ids_size()) > l.max_prompt_tokens) {
        return false;
      }
      break;
    case GenerateRequest::PROMPT_NOT_SET:
      return false;
  }
  // model, client_request_id, tenant and cache_salt are `bytes` on the wire: each must be UTF-8.
  if (!pd::utf8::IsValid(r.model()) ||
      !pd::utf8::IsValid(r.client_request_id()) ||
      (r.has_tenant() && !pd::utf8::IsValid(r.tenant())) ||
      (r.has_cache_salt() && !pd::utf8::IsValid(r.cache_salt()))) {
    return false;
  }
  if (r.n() > l.max_n) {  // choices: 0 and 1 are one
    return false;
  }
  if (r.client_request_id().size() > l.max_client_request_id_bytes) {
    return false;
  }
  if (r.has_tenant() && (r.tenant().empty() || r.tenant().size() > l.max_tenant_bytes)) {
    return false;
  }
  if (r.has_cache_salt() &&
      (r.cache_salt().empty() || r.cache_salt().size() > l.max_cache_salt_bytes)) {
    return false;
  }
  const pdserve::v1::SamplingParams& s = r.sampling();
  if (s.max_tokens() > l.max_tokens_limit) {
    return false;
  }
  if (s.max_tokens() > 0 && s.min_tokens() > s.max_tokens()) {
    return false;
  }
  if (!std::isfinite(s.temperature()) || s.temperature() < 0) {
    return false;
  }
  if (!std::isfinite(s.top_p()) || s.top_p() < 0 || s.top_p() > 1) {
    return false;
  }
  if (s.has_logprobs() && s.logprobs() > 20) {
    return false;  // the engine's (and OpenAI's) bound on top logprobs
  }
  if (s.top_k() > static_cast<uint32_t>(INT32_MAX)) {
    return false;  // the engine's top_k is an int32
  }
  // Issue #31 section 3: min_p in [0, 1]; presence and frequency penalties in [-2, 2]; the
  // repetition penalty finite and >= 0 (0 = unset); at most 300 logit_bias entries, each bias
  // in [-100, 100] (ids are checked against the model's vocabulary later, by the router).
  if (!(s.min_p() >= 0 && s.min_p() <= 1) ||
      !(s.presence_penalty() >= -2 && s.presence_penalty() <= 2) ||
      !(s.frequency_penalty() >= -2 && s.frequency_penalty() <= 2) ||
      !std::isfinite(s.repetition_penalty()) || s.repetition_penalty() < 0) {
    return false;
  }
  if (s.logit_bias_size() > 300) {
    return false;
  }
  for (const auto& [id, bias] : s.logit_bias()) {
    if (!(bias >= -100 && bias <= 100)) {
      return false;
    }
  }
  if (static_cast<uint64_t>(s.stop_size()) > l.max_stop_strings) {
    return false;
  }
  for (const std::string& stop : s.stop()) {
    if (stop.empty() || stop.size() > l.max_stop_string_bytes ||
        !pd::utf8::IsValid(stop)) {
      return false;
    }
  }
  return static_cast<uint64_t>(s.stop_token_ids_size()) <= l.max_stop_token_ids;
}

RequestLimits TinyLimits() {
  RequestLimits l;
  l.max_stop_strings = 2;
  l.max_stop_string_bytes = 4;
  l.max_stop_token_ids = 3;
  l.max_client_request_id_bytes = 8;
  l.max_tenant_bytes = 4;
  l.max_cache_salt_bytes = 4;
  l.max_prompt_bytes = 16;
  l.max_prompt_tokens = 4;
  l.max_tokens_limit = 100;
  l.max_n = 2;
  return l;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int* /*argc*/, char*** /*argv*/) {
  // Invalid UTF-8 in a string field fails the parse with an ERROR log line per input.
  google::protobuf::SetLogHandler(nullptr);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  GenerateRequest request;
  if (!request.ParseFromArray(data, static_cast<int>(size))) {
    return 0;
  }
  for (const RequestLimits& limits : {RequestLimits(), TinyLimits()}) {
    CHECK(limits.Validate().ok());
    const absl::Status status = pd::router::ValidateGenerateRequest(request, limits);
    const bool ref = RefValid(request, limits);
    if (ref && request.sampling().has_constraint()) {
      // Every other rule holds; whether the constraint compiles is the grammar engine's to say
      // (engine/grammar, tested against the shared schema set). A refusal names the constraint.
      if (!status.ok()) {
        CHECK(absl::IsInvalidArgument(status) || absl::IsOutOfRange(status)) << status;
        CHECK(absl::StartsWith(status.message(), "sampling.constraint")) << status;
        continue;
      }
    } else {
      CHECK_EQ(status.ok(), ref) << "validation disagrees with the documented rules: " << status
                                 << "\n"
                                 << request.ShortDebugString();
    }
    if (!status.ok()) {
      CHECK(absl::IsInvalidArgument(status)) << status;
      continue;
    }
    const absl::StatusOr<pd::engine::SamplingOptions> sampling =
        pd::worker::SamplingFromProto(request.sampling());
    CHECK(sampling.ok()) << "the router accepts sampling parameters the worker rejects: "
                         << sampling.status();
    if (request.has_text()) {
      CHECK(pd::utf8::ToValid(request.text()) == request.text());
    }
  }
  return 0;
}
