// Llama2cTokenizer: the llama2.c `tokenizer.bin` format (e.g. tok512.bin) and run.c's BPE.
//
// File layout (little-endian): int32 max_token_length, then for each id in [0, vocab_size):
// float32 score, int32 len, `len` raw piece bytes. vocab_size is not stored; it comes from the
// model header. Conventions: id 0 <unk>, 1 BOS, 2 EOS, pieces spelled "<0xHH>" are byte-fallback
// tokens, and SentencePiece's "▁" has already been replaced by an ASCII space.
//
// Encode() follows run.c `encode()` (spec: shared/models/stories260K/README.md): BOS if asked;
// a dummy-prefix " " piece if the text is non-empty; one piece per UTF-8 code point, or one
// byte-fallback token per byte when the code point has no piece; then repeatedly merge the
// adjacent pair whose concatenation is a piece with the highest score (leftmost on ties); EOS if
// asked. Implemented with a priority queue (O(n log n)); the result equals run.c's O(n^2) loop.
// Deliberate differences from run.c, none of which change the output for ordinary text:
//   - control pieces (<unk>, BOS, EOS) and byte-fallback pieces are never produced by lookup or
//     merging, so text like "\n<s>\n" or "<0x41>" cannot smuggle in control or byte tokens;
//   - NUL bytes are encoded (byte fallback) instead of ending the text.
//
// DecodeToken() follows run.c `decode()`: a piece following BOS loses its leading space, and a
// "<0xHH>" piece decodes to that raw byte. Differences, for a serving system:
//   - run.c prints nothing for a byte token that is neither printable ASCII nor whitespace (a
//     display rule in its safe_printf); we return the raw byte, because UTF-8 characters
//     outside the vocabulary arrive as several such bytes (use DecodeStream to re-assemble);
//   - BOS and EOS decode to "" (run.c would print "\n<s>\n" / "\n</s>\n").
//
// Thread-safety: immutable after Load(); all methods are const and may be called concurrently.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "engine/model/tokenizer.h"

namespace pd::engine {

class Llama2cTokenizer final : public Tokenizer {
 public:
  // Special ids fixed by the llama2.c export.
  static constexpr uint32_t kUnkId = 0;
  static constexpr uint32_t kBosId = 1;
  static constexpr uint32_t kEosId = 2;

  // Reads `path` with `vocab_size` entries (from the checkpoint header; must be > kEosId).
  // Errors: NotFound / PermissionDenied / InvalidArgument from MappedFile::Open; otherwise as
  // Parse().
  static absl::StatusOr<Llama2cTokenizer> Load(absl::string_view path, uint32_t vocab_size);

  // Parses the file contents `bytes`; `source` names them in error messages.
  // Errors: InvalidArgument when vocab_size <= kEosId, the data is truncated (names the id and
  // byte offset), a piece length is negative, or bytes remain after the last entry
  // (usually a vocab_size that does not belong to this file).
  static absl::StatusOr<Llama2cTokenizer> Parse(absl::string_view bytes, uint32_t vocab_size,
                                                absl::string_view source);

  Llama2cTokenizer(Llama2cTokenizer&&) noexcept = default;
  Llama2cTokenizer& operator=(Llama2cTokenizer&&) noexcept = default;
  Llama2cTokenizer(const Llama2cTokenizer&) = delete;
  Llama2cTokenizer& operator=(const Llama2cTokenizer&) = delete;

  // Never fails for this vocabulary as long as all 256 byte-fallback pieces exist; otherwise
  // InvalidArgument naming the first byte that has neither a piece nor a byte token.
  absl::StatusOr<std::vector<uint32_t>> Encode(absl::string_view text, bool add_bos,
                                               bool add_eos) const override;
  absl::StatusOr<std::string> DecodeToken(uint32_t prev, uint32_t next) const override;

  uint32_t vocab_size() const override { return static_cast<uint32_t>(pieces_.size()); }
  uint32_t bos_id() const override { return kBosId; }
  uint32_t eos_id() const override { return kEosId; }

  // The stored piece string of `id` (spaces, not "▁"; byte tokens spelled "<0xHH>") and its
  // merge score. `id` must be < vocab_size() (CHECK).
  const std::string& piece(uint32_t id) const;
  float score(uint32_t id) const;
  // The max_token_length field from the file header.
  int32_t max_token_length() const { return max_token_length_; }

 private:
  Llama2cTokenizer() = default;

  // Appends the ids of `text`'s code points (run.c step 3) to `ids`.
  absl::Status AppendCodePoints(absl::string_view text, std::vector<uint32_t>* ids) const;
  // Merges adjacent pairs in place (run.c step 4).
  void MergePairs(std::vector<uint32_t>* ids) const;

  int32_t max_token_length_ = 0;
  size_t longest_piece_bytes_ = 0;   // longest mergeable piece, to skip hopeless lookups
  std::vector<std::string> pieces_;  // [vocab_size]
  std::vector<float> scores_;        // [vocab_size]
  std::vector<int16_t> byte_of_id_;  // [vocab_size]; the byte of a "<0xHH>" piece, else -1
  std::vector<int64_t> id_of_byte_;  // [256]; the byte-fallback id of each byte, or -1
  // Normal pieces only (no control or byte pieces); first id wins for duplicates.
  absl::flat_hash_map<std::string, uint32_t> piece_to_id_;
};

}  // namespace pd::engine
