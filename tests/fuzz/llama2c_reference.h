// Oracles for the Llama2cTokenizer fuzz targets: run.c's O(n^2) BPE encode loop, written
// straight from shared/models/stories260K/README.md and the "deliberate differences" listed in
// engine/model/llama2c_tokenizer.h.
#pragma once

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/string_view.h"
#include "engine/model/llama2c_tokenizer.h"
#include "tests/fuzz/fuzz_util.h"

namespace pd::fuzz {

class Llama2cReference {
 public:
  explicit Llama2cReference(const engine::Llama2cTokenizer& t) : t_(t) {
    std::fill(std::begin(byte_id_), std::end(byte_id_), -1);
    // Ids 0..2 (<unk>, BOS, EOS) are control pieces whatever their spelling; byte-fallback
    // pieces come from the other ids.
    for (uint32_t id = engine::Llama2cTokenizer::kEosId + 1; id < t.vocab_size(); ++id) {
      const std::string& p = t.piece(id);
      const bool byte_piece =
          p.size() == 6 && p.compare(0, 3, "<0x") == 0 && p[5] == '>' && IsHex(p[3]) && IsHex(p[4]);
      if (byte_piece) {
        const int byte = HexValue(p[3]) * 16 + HexValue(p[4]);
        if (byte_id_[byte] < 0) {
          byte_id_[byte] = id;
        }
      } else {
        lookup_.try_emplace(p, id);  // first id wins
      }
    }
  }

  // True when Decode(Encode(text)) == text: the " " dummy prefix is an ordinary piece (so
  // decoding after BOS drops exactly the space that encoding added) and no ordinary piece
  // spells a byte-fallback piece inside it. run.c merges on the pieces' spellings, so a vocab
  // holding, say, "<0x72>e" merges byte token "<0x72>" with "e" into a piece that decodes as
  // those 7 characters, not as "re" (found by this fuzzer; the engine follows run.c there).
  bool RoundTrips() const {
    if (!lookup_.contains(" ")) {
      return false;
    }
    for (const auto& [piece, id] : lookup_) {
      if (absl::string_view(piece).find("<0x") != absl::string_view::npos) {
        return false;
      }
    }
    return true;
  }

  // run.c encode() (without BOS / EOS); nullopt when a byte has no piece and no byte token.
  std::optional<std::vector<uint32_t>> Encode(absl::string_view text) const {
    std::vector<uint32_t> ids;
    if (text.empty()) {
      return ids;
    }
    if (!AppendCodePoints(" ", &ids) || !AppendCodePoints(text, &ids)) {
      return std::nullopt;
    }
    std::string concat;
    while (true) {
      float best_score = -1e10f;
      size_t best = ids.size();
      uint32_t best_id = 0;
      for (size_t i = 0; i + 1 < ids.size(); ++i) {
        concat = t_.piece(ids[i]) + t_.piece(ids[i + 1]);
        auto it = lookup_.find(concat);
        if (it != lookup_.end() && t_.score(it->second) > best_score) {
          best_score = t_.score(it->second);
          best = i;
          best_id = it->second;
        }
      }
      if (best == ids.size()) {
        break;
      }
      ids[best] = best_id;
      ids.erase(ids.begin() + static_cast<std::ptrdiff_t>(best) + 1);
    }
    return ids;
  }

 private:
  static bool IsHex(char c) { return HexValue(c) >= 0; }
  static int HexValue(char c) {
    if (c >= '0' && c <= '9') {
      return c - '0';
    }
    if (c >= 'A' && c <= 'F') {
      return c - 'A' + 10;
    }
    if (c >= 'a' && c <= 'f') {
      return c - 'a' + 10;
    }
    return -1;
  }

  // A group is a byte plus up to 3 continuation bytes after it (run.c's UTF-8 walk).
  bool AppendCodePoints(absl::string_view text, std::vector<uint32_t>* ids) const {
    size_t i = 0;
    while (i < text.size()) {
      size_t n = 1;
      while (i + n < text.size() && n < 4 &&
             (static_cast<unsigned char>(text[i + n]) & 0xC0) == 0x80) {
        ++n;
      }
      auto it = lookup_.find(text.substr(i, n));
      if (it != lookup_.end()) {
        ids->push_back(it->second);
      } else {
        for (size_t k = i; k < i + n; ++k) {
          const int64_t id = byte_id_[static_cast<unsigned char>(text[k])];
          if (id < 0) {
            return false;
          }
          ids->push_back(static_cast<uint32_t>(id));
        }
      }
      i += n;
    }
    return true;
  }

  const engine::Llama2cTokenizer& t_;
  absl::flat_hash_map<std::string, uint32_t> lookup_;
  int64_t byte_id_[256];  // byte-fallback id of each byte, or -1
};

}  // namespace pd::fuzz
