#include "common/utf8/utf8.h"

#include <unicode/utf8.h>

#include <algorithm>

namespace pd::utf8 {

Char Decode(absl::string_view s, size_t pos) {
  // A character is at most 4 bytes: a window of 4 keeps ICU's int32_t offsets small however
  // long `s` is.
  const auto* p = reinterpret_cast<const uint8_t*>(s.data() + pos);
  const auto window = static_cast<int32_t>(std::min<size_t>(s.size() - pos, 4));
  int32_t i = 0;
  UChar32 c = 0;
  U8_NEXT(p, i, window, c);  // c < 0: ill-formed; i is then past the maximal subpart
  return Char{c < 0 ? -1 : static_cast<int32_t>(c), static_cast<size_t>(i)};
}

size_t ValidPrefix(absl::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {  // ASCII fast path: most text is
      ++i;
      continue;
    }
    const Char ch = Decode(s, i);
    if (!ch.valid()) {
      break;
    }
    i += ch.length;
  }
  return i;
}

std::string ToValid(std::string text) {
  size_t i = ValidPrefix(text);
  if (i == text.size()) {
    return text;
  }
  std::string out = text.substr(0, i);
  while (i < text.size()) {
    const Char ch = Decode(text, i);
    if (ch.valid()) {
      out.append(text, i, ch.length);
    } else {
      out += "\xEF\xBF\xBD";  // U+FFFD
    }
    i += ch.length;
  }
  return out;
}

void Append(uint32_t code_point, std::string* out) {
  if (code_point > 0x10FFFF || U_IS_SURROGATE(code_point)) {
    code_point = 0xFFFD;
  }
  uint8_t buf[U8_MAX_LENGTH];
  int32_t n = 0;
  U8_APPEND_UNSAFE(buf, n, code_point);
  out->append(reinterpret_cast<const char*>(buf), static_cast<size_t>(n));
}

size_t ByteGroupLength(absl::string_view s, size_t pos) {
  size_t n = 1;
  while (n < 4 && pos + n < s.size() && U8_IS_TRAIL(static_cast<uint8_t>(s[pos + n]))) {
    ++n;
  }
  return n;
}

}  // namespace pd::utf8
