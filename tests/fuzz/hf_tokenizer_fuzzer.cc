// Fuzzes the Hugging Face tokenizer.json loader (HfTokenizer::Parse) and Encode / Decode with
// whatever tokenizer it accepted.
//
// Input: the tokenizer.json text, optionally followed by a NUL byte and a text to encode (JSON
// cannot contain a raw NUL, so the split is unambiguous); without one a few fixed probes are
// encoded. Checks: errors use the documented codes, BOS / EOS are added exactly when asked, ids
// are in range, and Decode and DecodeStream agree.
#include <cstdint>
#include <string>
#include <vector>

#include "engine/model/hf_tokenizer.h"
#include "tests/fuzz/fuzz_util.h"
#include "tests/fuzz/tokenizer_checks.h"

namespace {

using pd::engine::HfTokenizer;

void EncodeAndCheck(const HfTokenizer& t, absl::string_view text, bool add_bos, bool add_eos) {
  absl::StatusOr<std::vector<uint32_t>> ids = t.Encode(text, add_bos, add_eos);
  if (!ids.ok()) {
    const absl::Status& s = ids.status();
    CHECK(absl::IsInvalidArgument(s) || absl::IsFailedPrecondition(s) ||
          absl::IsResourceExhausted(s))
        << s;
    if (absl::IsFailedPrecondition(s)) {
      CHECK((add_bos && t.bos_id() == HfTokenizer::kNoToken) ||
            (add_eos && t.eos_id() == HfTokenizer::kNoToken))
          << s;
    }
    return;
  }
  for (uint32_t id : *ids) {
    CHECK_LT(id, t.vocab_size());
  }
  if (add_bos) {
    CHECK(!ids->empty() && ids->front() == t.bos_id());
  }
  if (add_eos) {
    CHECK(!ids->empty() && ids->back() == t.eos_id());
  }
  pd::fuzz::CheckDecodeStream(t, *ids, HfTokenizer::kNoToken);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view input = pd::fuzz::AsView(data, size);
  const size_t nul = input.find('\0');
  const absl::string_view json = input.substr(0, nul);
  std::vector<absl::string_view> texts;
  if (nul != absl::string_view::npos) {
    texts.push_back(input.substr(nul + 1));
  } else {
    texts = {"Hello, world! 123 <|end_of_text|>", " \xE4\xB8\xAD\xE6\x96\x87 \xF0\x9F\x98\x80\n\n",
             "\xFF\xC3(\x80 it's"};
  }
  for (bool skip_special : {true, false}) {
    pd::engine::HfTokenizerOptions options;
    options.skip_special_tokens = skip_special;
    absl::StatusOr<HfTokenizer> t = HfTokenizer::Parse(json, options, "fuzz");
    if (!t.ok()) {
      CHECK(absl::IsInvalidArgument(t.status()) || absl::IsUnimplemented(t.status())) << t.status();
      return 0;
    }
    CHECK_GT(t->vocab_size(), 0u);
    CHECK(t->bos_id() == HfTokenizer::kNoToken || t->bos_id() < t->vocab_size());
    CHECK(t->eos_id() == HfTokenizer::kNoToken || t->eos_id() < t->vocab_size());
    for (uint32_t id = 0; id < t->vocab_size() && id < 4096; ++id) {
      CHECK(t->DecodeToken(HfTokenizer::kNoToken, id).ok());
      if (t->IsSpecial(id) && skip_special) {
        CHECK(t->DecodeToken(HfTokenizer::kNoToken, id)->empty());
      }
    }
    for (absl::string_view text : texts) {
      EncodeAndCheck(*t, text, t->add_bos_by_default(), t->add_eos_by_default());
      if (skip_special) {
        EncodeAndCheck(*t, text, true, true);
      }
    }
  }
  return 0;
}
