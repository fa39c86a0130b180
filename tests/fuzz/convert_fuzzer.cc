// Fuzzes the worker's proto <-> engine conversions (services/worker/convert.h) and the KV
// layout's wire form (services/base/kv_layout_proto.h) on a
// PrefillRequest parsed from the input (protobuf wire format): it carries the sampling
// parameters, the prefill side's KV layout, block hashes and opaque transport bytes.
//
// Checks: SamplingFromProto accepts exactly the documented ranges and copies every field;
// CheckLayout is reflexive, names every differing field and round-trips with LayoutToProto;
// common/utf8's validation and U+FFFD replacement (what the worker puts in a proto string)
// match an independent implementation of Unicode's "maximal subpart" replacement;
// ConcatBlockHashes inverts BlockHash::FromBytes; FinishReasonToProto is total.
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "common/hash/block_hash.h"
#include "common/utf8/utf8.h"
#include "engine/kvcache/kv_layout.h"
#include "google/protobuf/stubs/logging.h"
#include "pd/v1/worker.pb.h"
#include "services/base/kv_layout_proto.h"
#include "services/worker/convert.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

namespace iv1 = pdserve::internal::v1;
using pdserve::v1::SamplingParams;

bool SamplingValid(const SamplingParams& p) {
  for (const auto& [id, bias] : p.logit_bias()) {
    if (!(bias >= -100 && bias <= 100)) return false;
  }
  return std::isfinite(p.temperature()) && p.temperature() >= 0 && std::isfinite(p.top_p()) &&
         p.top_p() >= 0 && p.top_p() <= 1 &&
         (p.max_tokens() == 0 || p.min_tokens() <= p.max_tokens()) &&
         p.top_k() <= static_cast<uint32_t>(INT32_MAX) &&
         (!p.has_logprobs() || p.logprobs() <= 20) &&  // OpenAI's top_logprobs bound
         p.min_p() >= 0 && p.min_p() <= 1 && p.presence_penalty() >= -2 &&
         p.presence_penalty() <= 2 && p.frequency_penalty() >= -2 && p.frequency_penalty() <= 2 &&
         std::isfinite(p.repetition_penalty()) && p.repetition_penalty() >= 0;
}

void CheckSampling(const SamplingParams& p) {
  const absl::StatusOr<pd::engine::SamplingOptions> s = pd::worker::SamplingFromProto(p);
  if (SamplingValid(p) && p.has_constraint()) {
    // Whether the constraint compiles is the grammar engine's to say (engine/grammar); a
    // refusal names it, and an accepted one comes with its grammar.
    if (!s.ok()) {
      CHECK(absl::IsInvalidArgument(s.status()) || absl::IsOutOfRange(s.status())) << s.status();
      CHECK(absl::StartsWith(s.status().message(), "sampling.constraint")) << s.status();
      return;
    }
    CHECK(s->grammar != nullptr);
  } else {
    CHECK_EQ(s.ok(), SamplingValid(p)) << s.status() << " for " << p.ShortDebugString();
  }
  if (!s.ok()) {
    CHECK(absl::IsInvalidArgument(s.status())) << s.status();
    return;
  }
  CHECK_EQ(s->max_tokens, p.max_tokens());
  CHECK_EQ(s->min_tokens, p.min_tokens());
  CHECK_EQ(s->temperature, p.temperature());
  CHECK(s->top_p > 0 && s->top_p <= 1) << s->top_p;
  CHECK_EQ(s->top_p, p.top_p() > 0 ? p.top_p() : 1.0f);
  CHECK_GE(s->top_k, 0);
  CHECK_EQ(static_cast<uint32_t>(s->top_k), p.top_k());
  CHECK_EQ(s->seed, p.has_seed() ? p.seed() : 0);
  CHECK_EQ(s->stop.size(), static_cast<size_t>(p.stop_size()));
  for (int i = 0; i < p.stop_size(); ++i) {
    CHECK(s->stop[i] == p.stop(i));
  }
  CHECK(std::vector<uint32_t>(p.stop_token_ids().begin(), p.stop_token_ids().end()) ==
        s->stop_token_ids);
  CHECK_EQ(s->ignore_eos, p.ignore_eos());
  CHECK_EQ(s->logprobs, p.has_logprobs() ? static_cast<int32_t>(p.logprobs()) : -1);
  CHECK_EQ(s->min_p, p.min_p());
  CHECK_EQ(s->presence_penalty, p.presence_penalty());
  CHECK_EQ(s->frequency_penalty, p.frequency_penalty());
  CHECK_EQ(s->repetition_penalty, p.repetition_penalty() > 0 ? p.repetition_penalty() : 1.0f);
  // Every entry once, by ascending id.
  CHECK_EQ(s->logit_bias.size(), static_cast<size_t>(p.logit_bias_size()));
  for (size_t i = 0; i < s->logit_bias.size(); ++i) {
    const auto [id, bias] = s->logit_bias[i];
    CHECK(i == 0 || s->logit_bias[i - 1].first < id);
    CHECK(p.logit_bias().count(id) == 1 && p.logit_bias().at(id) == bias);
  }
}

void CheckLayouts(const iv1::KvLayout& theirs) {
  CHECK(pd::services::CheckLayout(theirs, theirs, "a", "b").ok());
  iv1::KvLayout other = theirs;
  other.set_block_size(theirs.block_size() + 1);
  other.set_head_dim(theirs.head_dim() ^ 1);
  const absl::Status diff = pd::services::CheckLayout(theirs, other, "mine", "theirs");
  CHECK(absl::IsFailedPrecondition(diff)) << diff;
  CHECK(diff.message().find("block_size mine=") != absl::string_view::npos) << diff;
  CHECK(diff.message().find("head_dim mine=") != absl::string_view::npos) << diff;

  // A worker's own layout with these dimensions, when it is a valid one.
  pd::kvcache::KvLayout layout;
  layout.num_layers = theirs.num_layers();
  layout.num_kv_heads = theirs.num_kv_heads();
  layout.head_dim = theirs.head_dim();
  layout.block_size = theirs.block_size();
  switch (theirs.dtype()) {
    case iv1::KV_DTYPE_BF16:
      layout.dtype = pd::kernels::DType::kBF16;
      break;
    case iv1::KV_DTYPE_FP16:
      layout.dtype = pd::kernels::DType::kF16;
      break;
    default:
      layout.dtype = pd::kernels::DType::kF32;
      break;
  }
  if (!layout.Validate().ok()) {
    return;
  }
  const iv1::KvLayout mine = pd::services::LayoutToProto(layout, theirs.model_fingerprint());
  CHECK_EQ(mine.num_layers(), theirs.num_layers());
  CHECK_EQ(mine.block_size(), theirs.block_size());
  CHECK_EQ(mine.block_bytes(), static_cast<uint64_t>(layout.block_bytes()));
  CHECK(pd::services::CheckLayout(mine, mine, "a", "b").ok());
  const absl::Status status = pd::services::CheckLayout(mine, theirs, "prefill", "decode");
  CHECK(status.ok() || absl::IsFailedPrecondition(status)) << status;
}

// Unicode 15 section 3.9 "U+FFFD substitution of maximal subparts", written from the standard
// (table 3-7), independently of common/utf8 (which uses ICU). Well-formed input comes back
// unchanged and ill-formed input never does, so RefToValidUtf8(s) == s says s is well-formed.
std::string RefToValidUtf8(absl::string_view s) {
  std::string out;
  size_t i = 0;
  while (i < s.size()) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c <= 0x7F) {
      out.push_back(static_cast<char>(c));
      ++i;
      continue;
    }
    // Sequence length and the range of the second byte, by lead byte (0: no sequence starts so).
    const size_t want = c >= 0xC2 && c <= 0xDF   ? 2
                        : c >= 0xE0 && c <= 0xEF ? 3
                        : c >= 0xF0 && c <= 0xF4 ? 4
                                                 : 0;
    const unsigned char lo = c == 0xE0 ? 0xA0 : c == 0xF0 ? 0x90 : 0x80;
    const unsigned char hi = c == 0xED ? 0x9F : c == 0xF4 ? 0x8F : 0xBF;
    // The longest prefix of a well-formed sequence here: the whole character, or the maximal
    // subpart (at least one byte).
    size_t k = 1;
    while (want > 0 && k < want && i + k < s.size()) {
      const unsigned char x = static_cast<unsigned char>(s[i + k]);
      if (k == 1 ? (x < lo || x > hi) : (x < 0x80 || x > 0xBF)) {
        break;
      }
      ++k;
    }
    if (want > 0 && k == want) {
      out.append(s.data() + i, k);
    } else {
      out += "\xEF\xBF\xBD";
    }
    i += k;
  }
  return out;
}

void CheckUtf8(const std::string& bytes) {
  const std::string ref = RefToValidUtf8(bytes);
  CHECK_EQ(pd::utf8::IsValid(bytes), ref == bytes) << "utf8::IsValid differs from the reference";
  const std::string fixed = pd::utf8::ToValid(bytes);
  CHECK(fixed == ref) << "utf8::ToValid differs from the reference";
  CHECK(pd::utf8::IsValid(fixed));
  CHECK(pd::utf8::ToValid(fixed) == fixed);
}

void CheckHashes(const std::string& bytes) {
  std::vector<pd::BlockHash> hashes;
  for (size_t i = 0; i + 16 <= bytes.size(); i += 16) {
    absl::StatusOr<pd::BlockHash> h =
        pd::BlockHash::FromBytes(absl::string_view(bytes).substr(i, 16));
    CHECK(h.ok()) << h.status();
    hashes.push_back(*h);
  }
  const std::string back = pd::ConcatBlockHashes(hashes);
  CHECK(back == bytes.substr(0, hashes.size() * 16));
  if (bytes.size() % 16 != 0) {
    CHECK(!pd::BlockHash::FromBytes(absl::string_view(bytes).substr(hashes.size() * 16)).ok());
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int* /*argc*/, char*** /*argv*/) {
  google::protobuf::SetLogHandler(nullptr);  // invalid UTF-8 in string fields logs per input
  for (int r = 0; r <= 5; ++r) {
    const auto proto = pd::worker::FinishReasonToProto(static_cast<pd::engine::FinishReason>(r));
    CHECK(pdserve::v1::FinishReason_IsValid(proto));
    CHECK_EQ(proto == pdserve::v1::FINISH_REASON_UNSPECIFIED, r == 0);
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  iv1::PrefillRequest request;
  if (!request.ParseFromArray(data, static_cast<int>(size))) {
    return 0;
  }
  CheckSampling(request.sampling());
  CheckLayouts(request.layout());
  CheckUtf8(request.transport_descriptor());
  CheckUtf8(request.transport_endpoint());
  CheckHashes(request.block_hashes());
  return 0;
}
