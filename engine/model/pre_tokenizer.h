// Building blocks of byte-level BPE tokenizers (GPT-2, Llama 3, Qwen2): the GPT-2
// byte-to-unicode mapping and regex pre-tokenization (PCRE2).
//
// Byte-level BPE stores every token as a string of printable code points, one per byte: GPT-2's
// bytes_to_unicode() maps the 188 printable Latin-1 bytes ('!'..'~', '¡'..'¬', '®'..'ÿ') to
// themselves and the other 68 bytes, in increasing order, to U+0100, U+0101, ... (so ' ' is 'Ġ',
// U+0120, and '\n' is 'Ċ', U+010A). The first 256 ids of GPT-2 and Llama 3 vocabularies are
// those code points in that list order ('!' = 0, ..., then U+0100 = byte 0x00).
//
// RegexSplitter compiles a pattern with PCRE2 in UTF + UCP mode (\p{L}, \p{N}, \s and
// case-insensitive groups are Unicode-aware) plus MATCH_INVALID_UTF, so arbitrary bytes can be
// split: invalid UTF-8 never matches and ends up in the gaps between matches. PCRE2 and the
// Oniguruma engine Hugging Face tokenizers uses agree on the patterns of GPT-2, Llama 3 and
// Qwen2; they may differ on exotic whitespace (e.g. U+0085 counts as \s in both, U+180E in
// neither).
//
// Thread-safety: the functions are pure; a RegexSplitter is immutable after Create and Split may
// be called concurrently (match data is per call).
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace pd::engine {

// The GPT-2 pre-tokenizer pattern (ByteLevel with use_regex = true).
inline constexpr char kGpt2SplitPattern[] =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
// The Llama 3 pre-tokenizer pattern (Split, Isolated), as in Meta's tokenizer.json.
inline constexpr char kLlama3SplitPattern[] =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// Code point of each byte under GPT-2's bytes_to_unicode().
const std::array<uint32_t, 256>& ByteToUnicode();
// The 256 bytes in GPT-2 vocabulary order (printable ranges first, then the rest ascending):
// byte-level token id i of a GPT-2 / Llama 3 vocabulary is the byte ByteOrder()[i].
const std::array<uint8_t, 256>& ByteOrder();
// `bytes` with every byte replaced by the UTF-8 of its code point (the tokenizer.json spelling).
std::string ByteLevelEncode(absl::string_view bytes);
// Inverse of ByteLevelEncode; nullopt when `text` is not valid UTF-8 or holds a code point that
// is not the image of a byte.
std::optional<std::string> ByteLevelDecode(absl::string_view text);

// How a Split pre-tokenizer treats the matches (Hugging Face SplitDelimiterBehavior).
enum class SplitBehavior : uint8_t {
  kIsolated,  // matches and the gaps between them are separate pieces
  kRemoved,   // only the gaps are pieces
};

class RegexSplitter {
 public:
  // Compiles `pattern` (JIT when available). InvalidArgument with PCRE2's message and the
  // offset when the pattern does not compile.
  static absl::StatusOr<RegexSplitter> Create(absl::string_view pattern,
                                              SplitBehavior behavior = SplitBehavior::kIsolated);

  RegexSplitter(RegexSplitter&&) noexcept;
  RegexSplitter& operator=(RegexSplitter&&) noexcept;
  ~RegexSplitter();

  // Appends the non-empty pieces of `text` to `pieces` (views into `text`); with kIsolated
  // their concatenation is `text`. Empty matches are skipped (the scan advances by one
  // character). Errors: ResourceExhausted when PCRE2 hits its match or heap limit, Internal for
  // any other matching error.
  absl::Status Split(absl::string_view text, std::vector<absl::string_view>* pieces) const;

  const std::string& pattern() const { return pattern_; }

 private:
  struct Compiled;
  RegexSplitter(std::string pattern, SplitBehavior behavior, std::unique_ptr<Compiled> compiled);

  std::string pattern_;
  SplitBehavior behavior_ = SplitBehavior::kIsolated;
  std::unique_ptr<Compiled> compiled_;
};

}  // namespace pd::engine
