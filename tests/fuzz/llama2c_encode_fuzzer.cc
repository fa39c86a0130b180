// Fuzzes Llama2cTokenizer::Encode / Decode / DecodeStream with the real llama2.c vocabulary
// (shared/models/stories260K/tok512.bin, loaded once). The input is the text.
//
// Checks: Encode equals the run.c reference (llama2c_reference.h) for texts up to 512 bytes,
// every byte is encodable (tok512 has all 256 byte-fallback tokens), Decode(Encode(text)) is
// the text, and DecodeStream deltas concatenate to Decode.
#include <cstdint>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/model/llama2c_tokenizer.h"
#include "tests/fuzz/fuzz_util.h"
#include "tests/fuzz/llama2c_reference.h"
#include "tests/fuzz/tokenizer_checks.h"

namespace {

using pd::engine::Llama2cTokenizer;

constexpr size_t kMaxReferenceText = 512;

struct Fixture {
  std::unique_ptr<Llama2cTokenizer> tokenizer;
  std::unique_ptr<pd::fuzz::Llama2cReference> reference;
};

const Fixture& GetFixture() {
  static const Fixture* fixture = [] {
    auto* f = new Fixture();
    const std::string path = std::string(PD_SHARED_DIR) + "/models/stories260K/tok512.bin";
    absl::StatusOr<Llama2cTokenizer> t = Llama2cTokenizer::Load(path, 512);
    CHECK(t.ok()) << "llama2c_encode_fuzzer needs " << path << ": " << t.status();
    f->tokenizer = std::make_unique<Llama2cTokenizer>(*std::move(t));
    f->reference = std::make_unique<pd::fuzz::Llama2cReference>(*f->tokenizer);
    CHECK(f->reference->RoundTrips());
    return f;
  }();
  return *fixture;
}

}  // namespace

// Builds the fixture before the first input, so that -timeout does not count it.
extern "C" int LLVMFuzzerInitialize(int* /*argc*/, char*** /*argv*/) {
  GetFixture();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const Fixture& f = GetFixture();
  const Llama2cTokenizer& t = *f.tokenizer;
  const absl::string_view text = pd::fuzz::AsView(data, size);
  absl::StatusOr<std::vector<uint32_t>> ids = t.Encode(text, /*add_bos=*/true, /*add_eos=*/false);
  CHECK(ids.ok()) << ids.status();
  CHECK_EQ((*ids)[0], Llama2cTokenizer::kBosId);
  for (size_t i = 1; i < ids->size(); ++i) {
    CHECK_LT((*ids)[i], t.vocab_size());
    CHECK_NE((*ids)[i], Llama2cTokenizer::kBosId);
    CHECK_NE((*ids)[i], Llama2cTokenizer::kEosId);
  }
  if (text.size() <= kMaxReferenceText) {
    std::optional<std::vector<uint32_t>> want = f.reference->Encode(text);
    CHECK(want.has_value());
    want->insert(want->begin(), Llama2cTokenizer::kBosId);
    CHECK(*ids == *want) << "Encode differs from the run.c reference";
  }
  const std::string decoded = pd::fuzz::CheckDecodeStream(t, *ids, Llama2cTokenizer::kNoToken);
  CHECK(decoded == text) << "Decode(Encode(text)) != text";
  // Decoding the prompt after its own BOS (what a serving loop does) gives the same text.
  const std::vector<uint32_t> rest(ids->begin() + 1, ids->end());
  CHECK(pd::fuzz::CheckDecodeStream(t, rest, Llama2cTokenizer::kBosId) == text);
  return 0;
}
