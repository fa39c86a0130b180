// Fuzzes the llama2.c tokenizer.bin loader (Llama2cTokenizer::Parse) and then Encode / Decode
// with whatever vocabulary it accepted.
//
// Input: [u32 LE vocab_size][u16 LE text length][text][tokenizer.bin contents]. Parse runs with
// the given vocab_size and, so that most inputs reach Encode, with the number of entries the
// contents actually hold. For an accepted vocabulary: Encode must equal the run.c reference
// (llama2c_reference.h), ids must be in range, Decode and DecodeStream must agree, and when
// " " is a piece, Decode(Encode(text)) must give the text back.
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "engine/model/llama2c_tokenizer.h"
#include "tests/fuzz/fuzz_util.h"
#include "tests/fuzz/llama2c_reference.h"
#include "tests/fuzz/tokenizer_checks.h"

namespace {

using pd::engine::Llama2cTokenizer;

// Longest text checked against the O(n^2) reference.
constexpr size_t kMaxReferenceText = 256;

// The number of entries `file` holds when read to its end, or nullopt when it does not end on
// an entry boundary.
std::optional<uint32_t> CountEntries(absl::string_view file) {
  if (file.size() < 4) {
    return std::nullopt;
  }
  size_t offset = 4;
  uint32_t count = 0;
  while (file.size() - offset >= 8) {
    int32_t len;
    std::memcpy(&len, file.data() + offset + 4, sizeof(len));
    if (len < 0 || file.size() - offset - 8 < static_cast<size_t>(len)) {
      return std::nullopt;
    }
    offset += 8 + static_cast<size_t>(len);
    ++count;
  }
  return offset == file.size() ? std::optional<uint32_t>(count) : std::nullopt;
}

void Exercise(const Llama2cTokenizer& t, absl::string_view text) {
  for (uint32_t id = 0; id < t.vocab_size(); ++id) {
    CHECK(t.DecodeToken(Llama2cTokenizer::kBosId, id).ok());
  }
  absl::StatusOr<std::vector<uint32_t>> ids = t.Encode(text, /*add_bos=*/true, /*add_eos=*/true);
  const pd::fuzz::Llama2cReference ref(t);
  if (text.size() <= kMaxReferenceText) {
    std::optional<std::vector<uint32_t>> want = ref.Encode(text);
    CHECK_EQ(ids.ok(), want.has_value()) << ids.status();
    if (want.has_value()) {
      want->insert(want->begin(), Llama2cTokenizer::kBosId);
      want->push_back(Llama2cTokenizer::kEosId);
      CHECK(*ids == *want) << "Encode differs from the run.c reference";
    }
  }
  if (!ids.ok()) {
    CHECK(absl::IsInvalidArgument(ids.status())) << ids.status();
    return;
  }
  CHECK_GE(ids->size(), 2u);
  for (uint32_t id : *ids) {
    CHECK_LT(id, t.vocab_size());
  }
  const std::string decoded = pd::fuzz::CheckDecodeStream(t, *ids, Llama2cTokenizer::kNoToken);
  if (ref.RoundTrips()) {
    CHECK(decoded == text) << "Decode(Encode(text)) != text";
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  absl::string_view input = pd::fuzz::AsView(data, size);
  if (input.size() < 6) {
    return 0;
  }
  uint32_t vocab_size;
  uint16_t text_len;
  std::memcpy(&vocab_size, input.data(), sizeof(vocab_size));
  std::memcpy(&text_len, input.data() + 4, sizeof(text_len));
  input.remove_prefix(6);
  const absl::string_view text = input.substr(0, text_len);
  const absl::string_view file = input.substr(text.size());

  std::vector<uint32_t> sizes = {vocab_size};
  if (std::optional<uint32_t> n = CountEntries(file); n.has_value() && *n != vocab_size) {
    sizes.push_back(*n);
  }
  for (uint32_t v : sizes) {
    absl::StatusOr<Llama2cTokenizer> t = Llama2cTokenizer::Parse(file, v, "fuzz");
    if (!t.ok()) {
      CHECK(absl::IsInvalidArgument(t.status())) << t.status();
      continue;
    }
    CHECK_EQ(t->vocab_size(), v);
    Exercise(*t, text);
  }
  return 0;
}
