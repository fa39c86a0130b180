#include "services/worker/convert.h"

#include <cmath>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/logprobs_params.h"

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
  engine::SamplingOptions s;
  s.max_tokens = p.max_tokens();
  s.min_tokens = p.min_tokens();
  s.temperature = p.temperature();
  s.top_p = p.top_p() > 0 ? p.top_p() : 1.0f;
  s.top_k = static_cast<int32_t>(p.top_k());
  s.seed = p.has_seed() ? p.seed() : 0;
  s.stop.assign(p.stop().begin(), p.stop().end());
  s.stop_token_ids.assign(p.stop_token_ids().begin(), p.stop_token_ids().end());
  s.ignore_eos = p.ignore_eos();
  if (p.has_logprobs()) {
    if (p.logprobs() > static_cast<uint32_t>(kernels::kMaxTopLogprobs)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "sampling.logprobs must be in [0, ", kernels::kMaxTopLogprobs, "], got ", p.logprobs()));
    }
    s.logprobs = static_cast<int32_t>(p.logprobs());
  }
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

namespace {

// Length of the well-formed UTF-8 character starting at s[i], or 0 when the bytes there are
// ill-formed; `*bad` is then the length of the maximal ill-formed subsequence (>= 1).
size_t Utf8CharLength(absl::string_view s, size_t i, size_t* bad) {
  const auto b = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char c = b(i);
  *bad = 1;
  if (c < 0x80) return 1;
  size_t n;
  unsigned char lo = 0x80, hi = 0xBF;  // allowed range of the second byte
  if (c >= 0xC2 && c <= 0xDF) {
    n = 2;
  } else if (c >= 0xE0 && c <= 0xEF) {
    n = 3;
    if (c == 0xE0) lo = 0xA0;  // no overlong forms
    if (c == 0xED) hi = 0x9F;  // no surrogates
  } else if (c >= 0xF0 && c <= 0xF4) {
    n = 4;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;  // <= U+10FFFF
  } else {
    return 0;
  }
  for (size_t k = 1; k < n; ++k) {
    if (i + k >= s.size()) {
      *bad = k;
      return 0;
    }
    const unsigned char x = b(i + k);
    if (k == 1 ? (x < lo || x > hi) : (x < 0x80 || x > 0xBF)) {
      *bad = k;
      return 0;
    }
  }
  return n;
}

}  // namespace

std::string ToValidUtf8(std::string text) {
  size_t i = 0;
  size_t bad = 0;
  while (i < text.size()) {  // fast path: most text is valid
    const size_t n = Utf8CharLength(text, i, &bad);
    if (n == 0) break;
    i += n;
  }
  if (i == text.size()) {
    return text;
  }
  std::string out = text.substr(0, i);
  while (i < text.size()) {
    const size_t n = Utf8CharLength(text, i, &bad);
    if (n == 0) {
      out += "\xEF\xBF\xBD";  // U+FFFD
      i += bad;
    } else {
      out.append(text, i, n);
      i += n;
    }
  }
  return out;
}

}  // namespace pd::worker
