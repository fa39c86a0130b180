// HfTokenizer: Hugging Face tokenizer.json for byte-level BPE (GPT-2, Llama 3, Qwen2-style
// vocabularies), implementing the Tokenizer interface.
//
// Supported tokenizer.json contents (anything else is Unimplemented, naming the component):
//   model          {"type": "BPE"} with "vocab" and "merges" (each merge either "a b" or
//                  ["a", "b"]), optional "ignore_merges" (a pre-token that is itself a vocab
//                  entry is emitted whole); byte_fallback, dropout, continuing_subword_prefix
//                  and end_of_word_suffix must be unset;
//   normalizer     null, NFC (Qwen2/3: ICU's, applied to the text between added tokens), or a
//                  Sequence of these;
//   pre_tokenizer  ByteLevel (add_prefix_space, use_regex = GPT-2 pattern), Split with a
//                  {"Regex": ...} or {"String": ...} pattern, behavior Isolated or Removed,
//                  invert false, or a Sequence of these; a ByteLevel step is required;
//   post_processor null, ByteLevel, TemplateProcessing or a Sequence of these: only used to
//                  find BOS / EOS (see below);
//   decoder        ByteLevel (or a Sequence of ByteLevel);
//   added_tokens   matched verbatim in the input before pre-tokenization, leftmost first and
//                  longest first at one position, special or not (as transformers does by
//                  default, so text containing "<|end_of_text|>" yields that token); lstrip /
//                  rstrip absorb adjacent ASCII whitespace; single_word is not supported.
// Encoding is exactly Hugging Face's: split on added tokens, pre-tokenize each segment, then per
// pre-token apply the merges by rank (lowest first, leftmost on ties) starting from one token
// per byte. Arbitrary bytes are accepted (invalid UTF-8 is split between regex matches and
// encoded byte by byte).
//
// BOS / EOS. The template "single" of a TemplateProcessing post-processor starting with a
// special token makes add_bos_by_default() true and that token the BOS (Llama 3:
// "<|begin_of_text|> $A"); one ending with a special token does the same for EOS. Encode() only
// ever adds BOS / EOS when asked (its flags), so callers pass add_bos_by_default(); other parts
// of a template (pair form, extra tokens) are ignored. Without a template, BOS / EOS are the
// added tokens "<|begin_of_text|>" / "<|end_of_text|>" (or "<s>" / "</s>", "<|endoftext|>"), and
// HfTokenizerOptions (normally the model's config.json ids) overrides all of this. A missing
// BOS or EOS is kNoToken; Encode asked to add it then fails with FailedPrecondition.
//
// Decoding: DecodeToken(prev, next) returns the raw bytes of `next` (the byte-level decoding of
// its vocab string, or the content of an added token), independent of `prev`; special added
// tokens decode to "" unless HfTokenizerOptions::skip_special_tokens is false. Pieces may end
// inside a UTF-8 character; DecodeStream re-assembles them.
//
// Thread-safety: immutable after Load(); all methods are const and may be called concurrently.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "engine/model/pre_tokenizer.h"
#include "engine/model/tokenizer.h"

namespace pd::engine {

struct HfTokenizerOptions {
  std::optional<uint32_t> bos_id;  // overrides what tokenizer.json implies
  std::optional<uint32_t> eos_id;
  bool skip_special_tokens = true;  // special added tokens decode to ""
};

class HfTokenizer final : public Tokenizer {
 public:
  // Reads and parses `path` (a tokenizer.json). Errors: as MappedFile::Open, then as Parse.
  static absl::StatusOr<HfTokenizer> Load(absl::string_view path,
                                          const HfTokenizerOptions& options = {});

  // Parses tokenizer.json text; `source` names it in messages. Errors:
  //   InvalidArgument  not JSON; a required field missing or of the wrong type; a duplicate,
  //                    negative or too large (>= 2^22) id; a merge naming a token (or producing
  //                    a concatenation) that is not in the vocab (names the merge index and
  //                    token); a regex that does not compile; an options id >= vocab_size;
  //   Unimplemented    a model, normalizer, pre-tokenizer, post-processor or decoder type (or
  //                    option) listed as unsupported above, naming it.
  static absl::StatusOr<HfTokenizer> Parse(absl::string_view json,
                                           const HfTokenizerOptions& options = {},
                                           absl::string_view source = "tokenizer.json");

  HfTokenizer(HfTokenizer&&) noexcept;
  HfTokenizer& operator=(HfTokenizer&&) noexcept;
  HfTokenizer(const HfTokenizer&) = delete;
  HfTokenizer& operator=(const HfTokenizer&) = delete;
  ~HfTokenizer() override;

  // Errors: FailedPrecondition when asked to add a BOS / EOS the tokenizer does not have;
  // InvalidArgument when a byte of `text` has no byte-level token in the vocab; ResourceExhausted
  // when the regex engine hits its limits.
  absl::StatusOr<std::vector<uint32_t>> Encode(absl::string_view text, bool add_bos,
                                               bool add_eos) const override;
  absl::StatusOr<std::string> DecodeToken(uint32_t prev, uint32_t next) const override;

  // 1 + the largest id of the vocab and the added tokens (ids without a token decode to "").
  uint32_t vocab_size() const override { return static_cast<uint32_t>(entries_.size()); }
  uint32_t bos_id() const override { return bos_id_; }
  uint32_t eos_id() const override { return eos_id_; }
  // The content of an added token marked "special"; "" for any other id.
  std::string SpecialTokenText(uint32_t id) const override;
  bool add_bos_by_default() const { return add_bos_by_default_; }
  bool add_eos_by_default() const { return add_eos_by_default_; }

  // The id of a token spelled as in tokenizer.json (byte-level string for vocab entries, content
  // for added tokens); nullopt when there is none.
  std::optional<uint32_t> TokenToId(absl::string_view token) const;
  // Raw bytes of `id` regardless of skip_special_tokens; `id` must be < vocab_size() (CHECK).
  const std::string& TokenBytes(uint32_t id) const;
  // True for added tokens marked "special".
  bool IsSpecial(uint32_t id) const;
  // Number of merges (ranks 0 .. num_merges() - 1).
  size_t num_merges() const { return merges_.size(); }

  // The pre-tokens of `text` (which must not contain added tokens), as raw bytes. For tests and
  // tools. Errors as Encode.
  absl::StatusOr<std::vector<std::string>> PreTokenize(absl::string_view text) const;

 private:
  enum class Kind : uint8_t { kHole, kRegular, kAdded, kSpecial };
  struct Entry {
    std::string bytes;
    Kind kind = Kind::kHole;
  };
  struct Merge {
    uint32_t rank;
    uint32_t id;  // the merged token
  };
  struct AddedToken {
    std::string content;
    uint32_t id;
    bool lstrip;
    bool rstrip;
  };
  struct PreStep {
    std::optional<RegexSplitter> splitter;  // a Split step, or ByteLevel with use_regex
    bool add_prefix_space = false;          // ByteLevel only
  };
  friend class HfTokenizerParser;

  HfTokenizer() = default;
  // Appends the ids of a segment without added tokens.
  absl::Status EncodeOrdinary(absl::string_view text, std::vector<uint32_t>* ids) const;
  // The normalizer's output for text between added tokens (NFC, or the text as it is).
  absl::StatusOr<std::string> Normalize(absl::string_view text) const;
  // Appends the ids of one pre-token.
  absl::Status EncodePiece(absl::string_view piece, std::vector<uint32_t>* ids) const;
  static uint64_t PairKey(uint32_t left, uint32_t right) {
    return (static_cast<uint64_t>(left) << 32) | right;
  }

  std::vector<Entry> entries_;                              // [vocab_size]
  absl::flat_hash_map<std::string, uint32_t> token_to_id_;  // tokenizer.json spellings
  absl::flat_hash_map<std::string, uint32_t> bytes_to_id_;  // regular tokens by raw bytes
  std::array<int64_t, 256> byte_id_{};                      // id of each single byte, or -1
  absl::flat_hash_map<uint64_t, Merge> merges_;             // PairKey(left, right) -> merge
  bool ignore_merges_ = false;
  std::vector<PreStep> pre_steps_;
  std::vector<AddedToken> added_;
  absl::flat_hash_map<std::string, uint32_t> added_index_;  // content -> index into added_
  // Distinct content lengths of the added tokens starting with each byte, longest first: a
  // match at a position is found with one hash lookup per length (Llama 3 has 256 added
  // tokens, generated 1b models 127k, all starting with '<').
  std::array<std::vector<uint32_t>, 256> added_lengths_by_first_byte_;
  uint32_t bos_id_ = kNoToken;
  uint32_t eos_id_ = kNoToken;
  bool add_bos_by_default_ = false;
  bool add_eos_by_default_ = false;
  bool nfc_ = false;  // the normalizer is NFC
  bool skip_special_tokens_ = true;
};

}  // namespace pd::engine
