#include "services/worker/convert.h"

#include <cmath>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

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

pdserve::internal::v1::KvLayout LayoutToProto(const kvcache::KvLayout& layout,
                                              const std::string& fingerprint) {
  pdserve::internal::v1::KvLayout p;
  p.set_model_fingerprint(fingerprint);
  switch (layout.dtype) {
    case kernels::DType::kF32:
      p.set_dtype(pdserve::internal::v1::KV_DTYPE_FP32);
      break;
    case kernels::DType::kBF16:
      p.set_dtype(pdserve::internal::v1::KV_DTYPE_BF16);
      break;
    case kernels::DType::kF16:
      p.set_dtype(pdserve::internal::v1::KV_DTYPE_FP16);
      break;
    default:
      p.set_dtype(pdserve::internal::v1::KV_DTYPE_UNSPECIFIED);
      break;
  }
  p.set_block_size(static_cast<uint32_t>(layout.block_size));
  p.set_num_layers(static_cast<uint32_t>(layout.num_layers));
  p.set_num_kv_heads(static_cast<uint32_t>(layout.num_kv_heads));
  p.set_head_dim(static_cast<uint32_t>(layout.head_dim));
  p.set_block_bytes(static_cast<uint64_t>(layout.block_bytes()));
  p.set_layout_version(kLayoutVersion);
  p.set_protocol_version(kHandoffProtocolVersion);
  return p;
}

absl::Status CheckLayout(const pdserve::internal::v1::KvLayout& mine,
                         const pdserve::internal::v1::KvLayout& theirs, absl::string_view mine_name,
                         absl::string_view theirs_name) {
  std::vector<std::string> diffs;
  auto cmp = [&](absl::string_view field, const auto& a, const auto& b) {
    if (a != b) {
      diffs.push_back(absl::StrCat(field, " ", mine_name, "=", a, " ", theirs_name, "=", b));
    }
  };
  cmp("model_fingerprint", mine.model_fingerprint(), theirs.model_fingerprint());
  cmp("dtype", pdserve::internal::v1::KvDtype_Name(mine.dtype()),
      pdserve::internal::v1::KvDtype_Name(theirs.dtype()));
  cmp("block_size", mine.block_size(), theirs.block_size());
  cmp("num_layers", mine.num_layers(), theirs.num_layers());
  cmp("num_kv_heads", mine.num_kv_heads(), theirs.num_kv_heads());
  cmp("head_dim", mine.head_dim(), theirs.head_dim());
  cmp("block_bytes", mine.block_bytes(), theirs.block_bytes());
  cmp("layout_version", mine.layout_version(), theirs.layout_version());
  cmp("protocol_version", mine.protocol_version(), theirs.protocol_version());
  if (diffs.empty()) {
    return absl::OkStatus();
  }
  return absl::FailedPreconditionError(
      absl::StrCat("kv layout mismatch: ", absl::StrJoin(diffs, ", ")));
}

std::string HashesToBytes(absl::Span<const BlockHash> hashes) {
  return ConcatBlockHashes(hashes);
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
