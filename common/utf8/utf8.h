// UTF-8 decoding and encoding, written once for the project. Well-formed means Unicode's
// table 3-7 (no overlong forms, no surrogates U+D800..U+DFFF, nothing above U+10FFFF);
// ill-formed input is described by its maximal subparts (Unicode section 3.9), the unit one
// U+FFFD replaces.
//
// The decoding itself is ICU's header-only U8_NEXT (Debian's libicu-dev; no ICU library is
// linked). Callers with a different policy for ill-formed bytes (Python's repr treats each as
// one character, the tokenizers group bytes as run.c does) build it on these functions.
//
// All functions are pure and thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"

namespace pd::utf8 {

// One decoded character, or one maximal ill-formed subpart.
struct Char {
  // The code point (0..0x10FFFF, never a surrogate), or -1 when the bytes are ill-formed.
  int32_t code_point = -1;
  // Bytes taken: the character's length (1..4), or the maximal ill-formed subpart's (1..3):
  // the longest prefix of a well-formed sequence, at least one byte.
  size_t length = 0;

  bool valid() const { return code_point >= 0; }
};

// Decodes the character that starts at s[pos]; pos < s.size().
Char Decode(absl::string_view s, size_t pos);

// The byte offset of the first ill-formed sequence in `s`, or s.size() when all of `s` is
// well-formed.
size_t ValidPrefix(absl::string_view s);

// True when all of `s` is well-formed.
inline bool IsValid(absl::string_view s) { return ValidPrefix(s) == s.size(); }

// `text` with each maximal ill-formed subpart replaced by U+FFFD (Unicode's recommended
// practice); well-formed text comes back unchanged, without a copy.
std::string ToValid(std::string text);

// Appends the UTF-8 form of `code_point`; a surrogate or a value above U+10FFFF, which have
// none, appends U+FFFD.
void Append(uint32_t code_point, std::string* out);

// 1 + the number of continuation bytes (10xxxxxx) right after s[pos], at most 4 in all;
// pos < s.size(). For well-formed text this is the character's length; for any bytes it is
// llama2.c's (run.c) grouping, which the tokenizers match.
size_t ByteGroupLength(absl::string_view s, size_t pos);

}  // namespace pd::utf8
