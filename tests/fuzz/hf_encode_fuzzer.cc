// Fuzzes HfTokenizer::Encode / Decode / DecodeStream with a real byte-level BPE tokenizer.json
// (Llama 3 layout, the Llama 3 pre-tokenizer regex; built once by engine/tools/
// tokenizer_builder.h for a 1024-token vocabulary), with ignore_merges off and on. The input is
// the text.
//
// Checks: every text encodes, Decode(Encode(text)) is the text (special tokens not skipped),
// DecodeStream agrees with Decode, and for texts without added tokens the ids equal a naive
// O(n^2) BPE over PreTokenize's pieces that applies the file's merges by rank (lowest first,
// leftmost on ties), as Hugging Face tokenizers does.
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "engine/model/hf_tokenizer.h"
#include "engine/model/pre_tokenizer.h"
#include "engine/tools/tokenizer_builder.h"
#include "nlohmann/json.hpp"
#include "tests/fuzz/fuzz_util.h"
#include "tests/fuzz/tokenizer_checks.h"

namespace {

using Json = nlohmann::json;
using pd::engine::HfTokenizer;

constexpr uint32_t kVocabSize = 1024;
// Longest pre-token checked against the O(n^2) reference.
constexpr size_t kMaxReferencePiece = 256;

class NaiveBpe {
 public:
  NaiveBpe(const Json& model, bool ignore_merges) : ignore_merges_(ignore_merges) {
    for (auto it = model["vocab"].begin(); it != model["vocab"].end(); ++it) {
      vocab_.emplace(it.key(), it.value().get<uint32_t>());
    }
    uint32_t rank = 0;
    for (const Json& m : model["merges"]) {
      rank_.emplace(std::make_pair(m[0].get<std::string>(), m[1].get<std::string>()), rank++);
    }
  }

  // The ids of one pre-token (raw bytes).
  std::vector<uint32_t> Encode(absl::string_view piece) const {
    if (ignore_merges_) {
      auto whole = vocab_.find(pd::engine::ByteLevelEncode(piece));
      if (whole != vocab_.end()) {
        return {whole->second};
      }
    }
    std::vector<std::string> symbols;
    for (char c : piece) {
      symbols.push_back(pd::engine::ByteLevelEncode(absl::string_view(&c, 1)));
    }
    while (symbols.size() > 1) {
      uint32_t best_rank = std::numeric_limits<uint32_t>::max();
      size_t best = 0;
      for (size_t i = 0; i + 1 < symbols.size(); ++i) {
        auto it = rank_.find(std::make_pair(symbols[i], symbols[i + 1]));
        if (it != rank_.end() && it->second < best_rank) {
          best_rank = it->second;
          best = i;
        }
      }
      if (best_rank == std::numeric_limits<uint32_t>::max()) {
        break;
      }
      symbols[best] += symbols[best + 1];
      symbols.erase(symbols.begin() + static_cast<std::ptrdiff_t>(best) + 1);
    }
    std::vector<uint32_t> ids;
    for (const std::string& s : symbols) {
      auto it = vocab_.find(s);
      CHECK(it != vocab_.end()) << "merged symbol not in the vocab";
      ids.push_back(it->second);
    }
    return ids;
  }

 private:
  bool ignore_merges_;
  absl::flat_hash_map<std::string, uint32_t> vocab_;
  absl::flat_hash_map<std::pair<std::string, std::string>, uint32_t> rank_;
};

struct Variant {
  std::unique_ptr<HfTokenizer> tokenizer;
  std::unique_ptr<NaiveBpe> reference;
};

const std::vector<Variant>& Variants() {
  static const std::vector<Variant>* variants = [] {
    absl::StatusOr<std::string> text = pd::engine::BuildTokenizerJson(kVocabSize);
    CHECK(text.ok()) << text.status();
    Json j = Json::parse(*text);
    auto* out = new std::vector<Variant>();
    for (bool ignore_merges : {false, true}) {
      j["model"]["ignore_merges"] = ignore_merges;
      pd::engine::HfTokenizerOptions options;
      options.skip_special_tokens = false;
      absl::StatusOr<HfTokenizer> t = HfTokenizer::Parse(j.dump(), options, "built");
      CHECK(t.ok()) << t.status();
      out->push_back(Variant{std::make_unique<HfTokenizer>(*std::move(t)),
                             std::make_unique<NaiveBpe>(j["model"], ignore_merges)});
    }
    return out;
  }();
  return *variants;
}

}  // namespace

// Builds the fixture before the first input, so that -timeout does not count it.
extern "C" int LLVMFuzzerInitialize(int* /*argc*/, char*** /*argv*/) {
  Variants();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view text = pd::fuzz::AsView(data, size);
  for (const Variant& v : Variants()) {
    const HfTokenizer& t = *v.tokenizer;
    absl::StatusOr<std::vector<uint32_t>> ids = t.Encode(text, /*add_bos=*/true, /*add_eos=*/true);
    CHECK(ids.ok()) << ids.status();
    CHECK_GE(ids->size(), 2u);
    CHECK_EQ(ids->front(), t.bos_id());
    CHECK_EQ(ids->back(), t.eos_id());
    const std::vector<uint32_t> body(ids->begin() + 1, ids->end() - 1);
    const std::string decoded = pd::fuzz::CheckDecodeStream(t, body, t.bos_id());
    CHECK(decoded == text) << "Decode(Encode(text)) != text";
    if (text.find("<|") != absl::string_view::npos) {
      continue;  // may hold added tokens: PreTokenize is only defined without them
    }
    absl::StatusOr<std::vector<std::string>> pieces = t.PreTokenize(text);
    CHECK(pieces.ok()) << pieces.status();
    std::string joined;
    std::vector<uint32_t> want;
    bool checked = true;
    for (const std::string& piece : *pieces) {
      CHECK(!piece.empty());
      joined += piece;
      if (piece.size() > kMaxReferencePiece) {
        checked = false;
        continue;
      }
      const std::vector<uint32_t> ids_of_piece = v.reference->Encode(piece);
      want.insert(want.end(), ids_of_piece.begin(), ids_of_piece.end());
    }
    CHECK(joined == text) << "pre-tokens do not concatenate to the text";
    if (checked) {
      CHECK(body == want) << "Encode differs from the naive BPE reference";
    }
  }
  return 0;
}
