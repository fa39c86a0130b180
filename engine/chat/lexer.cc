#include "engine/chat/lexer.h"

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/utf8/utf8.h"

namespace pd::chat::internal {
namespace {

// Python's str.isspace() over ASCII (what \s and str.strip() match in Jinja2's lexer).
bool IsSpace(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f' ||
         (c >= 0x1c && c <= 0x1f);
}
bool IsDigit(char c) { return c >= '0' && c <= '9'; }
bool IsNameStart(char c) { return absl::ascii_isalpha(c) || c == '_'; }
bool IsNameChar(char c) { return absl::ascii_isalnum(c) || c == '_'; }

class Lexer {
 public:
  Lexer(std::string source, const LexOptions& options)
      : src_(std::move(source)), options_(options) {
    line_starts_.push_back(0);
    for (size_t i = 0; i < src_.size(); ++i) {
      if (src_[i] == '\n') {
        line_starts_.push_back(i + 1);
      }
    }
  }

  absl::StatusOr<std::vector<Token>> Run() {
    size_t pos = 0;
    while (pos < src_.size()) {
      absl::Status s = LexRoot(&pos);
      if (!s.ok()) {
        return s;
      }
    }
    Add(TokenType::kEnd, "", src_.size());
    return std::move(tokens_);
  }

 private:
  absl::Status Error(size_t offset, absl::string_view what) const {
    const auto it = std::upper_bound(line_starts_.begin(), line_starts_.end(), offset);
    const size_t line = static_cast<size_t>(it - line_starts_.begin());
    const size_t column = offset - line_starts_[line - 1] + 1;
    return absl::InvalidArgumentError(absl::StrCat("line ", line, ", column ", column, ": ", what));
  }

  void Add(TokenType type, std::string value, size_t offset) {
    const auto it = std::upper_bound(line_starts_.begin(), line_starts_.end(), offset);
    const size_t line = static_cast<size_t>(it - line_starts_.begin());
    tokens_.push_back(Token{type, std::move(value), static_cast<int>(line),
                            static_cast<int>(offset - line_starts_[line - 1] + 1)});
  }

  bool At(size_t pos, absl::string_view s) const {
    return absl::string_view(src_).substr(pos, s.size()) == s;
  }

  size_t SkipSpace(size_t pos) const {
    while (pos < src_.size() && IsSpace(src_[pos])) {
      ++pos;
    }
    return pos;
  }

  // Text before a tag, with the tag's whitespace control applied: `-` strips all whitespace
  // before it; otherwise lstrip_blocks (not for `{{`, not with `+`) removes the spaces between
  // the start of the line and a tag that is alone on it so far.
  void AddText(size_t begin, size_t end, char sign, bool lstrip_allowed) {
    std::string text = src_.substr(begin, end - begin);
    if (sign == '-') {
      size_t n = text.size();
      while (n > 0 && IsSpace(text[n - 1])) {
        --n;
      }
      text.resize(n);
    } else if (sign != '+' && options_.lstrip_blocks && lstrip_allowed) {
      const size_t nl = text.rfind('\n');
      const size_t l_pos = nl == std::string::npos ? 0 : nl + 1;
      const bool line_starting = begin == 0 || src_[begin - 1] == '\n';
      if ((l_pos > 0 || line_starting) && l_pos < text.size() &&
          std::all_of(text.begin() + l_pos, text.end(), IsSpace)) {
        text.resize(l_pos);
      }
    }
    if (!text.empty()) {
      Add(TokenType::kText, std::move(text), begin);
    }
  }

  // Matches `%}` (block) at pos with its modifiers; returns the end of the match or npos.
  size_t MatchBlockEnd(size_t pos) const {
    if (At(pos, "+%}")) {
      return pos + 3;
    }
    if (At(pos, "-%}")) {
      return SkipSpace(pos + 3);
    }
    if (At(pos, "%}")) {
      pos += 2;
      if (options_.trim_blocks && pos < src_.size() && src_[pos] == '\n') {
        ++pos;
      }
      return pos;
    }
    return std::string::npos;
  }

  absl::Status LexRoot(size_t* pos) {
    size_t start = *pos;
    size_t tag = std::string::npos;
    for (size_t p = src_.find('{', start); p != std::string::npos; p = src_.find('{', p + 1)) {
      if (p + 1 < src_.size() && (src_[p + 1] == '{' || src_[p + 1] == '%' || src_[p + 1] == '#')) {
        tag = p;
        break;
      }
    }
    if (tag == std::string::npos) {
      Add(TokenType::kText, src_.substr(start), start);
      *pos = src_.size();
      return absl::OkStatus();
    }
    const char kind = src_[tag + 1];
    size_t p = tag + 2;
    char sign = 0;
    if (p < src_.size() && (src_[p] == '-' || src_[p] == '+')) {
      sign = src_[p++];
    }
    if (kind == '%') {
      // {% raw %}: a block whose body is text.
      size_t q = SkipSpace(p);
      if (At(q, "raw")) {
        q = SkipSpace(q + 3);
        size_t body = std::string::npos;
        if (At(q, "-%}")) {
          body = SkipSpace(q + 3);
        } else if (At(q, "%}")) {
          body = q + 2;
        }
        if (body != std::string::npos) {
          AddText(start, tag, sign, true);
          return LexRaw(tag, body, pos);
        }
      }
    }
    AddText(start, tag, sign, kind != '{');
    if (kind == '#') {
      return LexComment(tag, p, pos);
    }
    Add(kind == '{' ? TokenType::kVarBegin : TokenType::kBlockBegin, "", tag);
    return LexTag(kind == '{', p, pos);
  }

  absl::Status LexComment(size_t tag, size_t p, size_t* pos) {
    const size_t end = src_.find("#}", p);
    if (end == std::string::npos) {
      return Error(tag, "missing end of comment tag");
    }
    if (end > p && src_[end - 1] == '-') {
      *pos = SkipSpace(end + 2);
    } else if (end > p && src_[end - 1] == '+') {
      *pos = end + 2;
    } else {
      *pos = end + 2;
      if (options_.trim_blocks && *pos < src_.size() && src_[*pos] == '\n') {
        ++*pos;
      }
    }
    return absl::OkStatus();
  }

  absl::Status LexRaw(size_t tag, size_t body, size_t* pos) {
    for (size_t p = src_.find("{%", body); p != std::string::npos; p = src_.find("{%", p + 1)) {
      size_t q = p + 2;
      char sign = 0;
      if (q < src_.size() && (src_[q] == '-' || src_[q] == '+')) {
        sign = src_[q++];
      }
      q = SkipSpace(q);
      if (!At(q, "endraw")) {
        continue;
      }
      const size_t end = MatchBlockEnd(SkipSpace(q + 6));
      if (end == std::string::npos) {
        continue;
      }
      AddText(body, p, sign, true);
      *pos = end;
      return absl::OkStatus();
    }
    return Error(tag, "missing end of raw directive");
  }

  // The tokens inside {{ }} or {% %}, up to and including the closing delimiter.
  absl::Status LexTag(bool variable, size_t p, size_t* pos) {
    std::vector<char> balance;  // expected closing brackets
    while (true) {
      if (p >= src_.size()) {
        return Error(p, variable ? "unexpected end of template, expected '}}'"
                                 : "unexpected end of template, expected '%}'");
      }
      if (balance.empty()) {
        if (variable) {
          if (At(p, "-}}")) {
            Add(TokenType::kVarEnd, "", p);
            *pos = SkipSpace(p + 3);
            return absl::OkStatus();
          }
          if (At(p, "}}")) {
            Add(TokenType::kVarEnd, "", p);
            *pos = p + 2;
            return absl::OkStatus();
          }
        } else if (const size_t end = MatchBlockEnd(p); end != std::string::npos) {
          Add(TokenType::kBlockEnd, "", p);
          *pos = end;
          return absl::OkStatus();
        }
      }
      const char c = src_[p];
      if (IsSpace(c)) {
        ++p;
        continue;
      }
      if (size_t n = MatchNumber(p); n > 0) {
        p += n;
        continue;
      }
      if (IsNameStart(c)) {
        size_t e = p + 1;
        while (e < src_.size() && IsNameChar(src_[e])) {
          ++e;
        }
        Add(TokenType::kName, src_.substr(p, e - p), p);
        p = e;
        continue;
      }
      if (c == '\'' || c == '"') {
        absl::Status s = LexString(&p);
        if (!s.ok()) {
          return s;
        }
        continue;
      }
      absl::Status s = LexOperator(&p, &balance);
      if (!s.ok()) {
        return s;
      }
    }
  }

  // Digits with single underscores between them ((\d+_)*\d+); returns the length or 0.
  size_t DigitRun(size_t p) const {
    size_t e = p;
    while (e < src_.size() && IsDigit(src_[e])) {
      ++e;
      if (e + 1 < src_.size() && src_[e] == '_' && IsDigit(src_[e + 1])) {
        ++e;
      }
    }
    return e - p;
  }

  // A float or integer literal at p (Jinja2's float_re, then integer_re); adds the token and
  // returns its length, or 0 when none starts there.
  size_t MatchNumber(size_t p) {
    if (!IsDigit(src_[p])) {
      return 0;
    }
    const auto strip = [](std::string s) {
      s.erase(std::remove(s.begin(), s.end(), '_'), s.end());
      return s;
    };
    // Float: digits, then either [.digits] e[+-]digits, or .digits. Not after a '.'.
    if (p == 0 || src_[p - 1] != '.') {
      const size_t int_len = DigitRun(p);
      size_t e = p + int_len;
      size_t frac_end = e;
      if (e + 1 < src_.size() && src_[e] == '.' && IsDigit(src_[e + 1])) {
        frac_end = e + 1 + DigitRun(e + 1);
      }
      size_t exp_end = 0;
      if (frac_end < src_.size() && (src_[frac_end] == 'e' || src_[frac_end] == 'E')) {
        size_t x = frac_end + 1;
        if (x < src_.size() && (src_[x] == '+' || src_[x] == '-')) {
          ++x;
        }
        if (x < src_.size() && IsDigit(src_[x])) {
          exp_end = x + DigitRun(x);
        }
      }
      const size_t end = exp_end != 0 ? exp_end : (frac_end != e ? frac_end : 0);
      if (end != 0) {
        Add(TokenType::kFloat, strip(src_.substr(p, end - p)), p);
        return end - p;
      }
    }
    // Integer: 0b/0o/0x prefixed, [1-9](_?\d)*, or 0(_?0)*.
    size_t e = p;
    if (src_[p] == '0' && p + 2 < src_.size() &&
        (absl::ascii_tolower(src_[p + 1]) == 'b' || absl::ascii_tolower(src_[p + 1]) == 'o' ||
         absl::ascii_tolower(src_[p + 1]) == 'x')) {
      const char base = absl::ascii_tolower(src_[p + 1]);
      const auto ok = [base](char c) {
        return base == 'b'   ? (c == '0' || c == '1')
               : base == 'o' ? (c >= '0' && c <= '7')
                             : absl::ascii_isxdigit(c);
      };
      size_t x = p + 2;
      while (x < src_.size()) {
        if (ok(src_[x])) {
          ++x;
        } else if (src_[x] == '_' && x + 1 < src_.size() && ok(src_[x + 1])) {
          x += 2;
        } else {
          break;
        }
      }
      if (x > p + 2) {
        e = x;
      }
    }
    if (e == p) {
      const char lead = src_[p];
      e = p + 1;
      while (e < src_.size()) {
        const bool digit_ok = lead == '0' ? src_[e] == '0' : IsDigit(src_[e]);
        const bool next_ok =
            e + 1 < src_.size() && (lead == '0' ? src_[e + 1] == '0' : IsDigit(src_[e + 1]));
        if (digit_ok) {
          ++e;
        } else if (src_[e] == '_' && next_ok) {
          e += 2;
        } else {
          break;
        }
      }
    }
    Add(TokenType::kInt, strip(src_.substr(p, e - p)), p);
    return e - p;
  }

  // A quoted string with Python's unicode-escape rules (unknown escapes stay as written).
  absl::Status LexString(size_t* p) {
    const size_t start = *p;
    const char quote = src_[start];
    std::string out;
    size_t i = start + 1;
    while (true) {
      if (i >= src_.size()) {
        return Error(start, "unterminated string literal");
      }
      const char c = src_[i];
      if (c == quote) {
        break;
      }
      if (c != '\\') {
        out.push_back(c);
        ++i;
        continue;
      }
      if (i + 1 >= src_.size()) {
        return Error(start, "unterminated string literal");
      }
      const char e = src_[i + 1];
      i += 2;
      switch (e) {
        case '\n':
          break;  // line continuation
        case '\\':
        case '\'':
        case '"':
          out.push_back(e);
          break;
        case 'a':
          out.push_back('\a');
          break;
        case 'b':
          out.push_back('\b');
          break;
        case 'f':
          out.push_back('\f');
          break;
        case 'n':
          out.push_back('\n');
          break;
        case 'r':
          out.push_back('\r');
          break;
        case 't':
          out.push_back('\t');
          break;
        case 'v':
          out.push_back('\v');
          break;
        case 'x':
        case 'u':
        case 'U': {
          const size_t digits = e == 'x' ? 2 : e == 'u' ? 4 : 8;
          uint32_t cp = 0;
          for (size_t k = 0; k < digits; ++k) {
            if (i + k >= src_.size() || !absl::ascii_isxdigit(src_[i + k])) {
              return Error(i - 2, absl::StrCat("truncated \\", std::string(1, e), " escape"));
            }
            const char h = absl::ascii_tolower(src_[i + k]);
            cp = cp * 16 + static_cast<uint32_t>(IsDigit(h) ? h - '0' : h - 'a' + 10);
          }
          if (cp > 0x10FFFF) {
            return Error(i - 2, "escape outside the Unicode range");
          }
          i += digits;
          utf8::Append(cp, &out);  // a lone surrogate has no UTF-8 form: U+FFFD
          break;
        }
        default:
          if (e >= '0' && e <= '7') {
            uint32_t cp = static_cast<uint32_t>(e - '0');
            for (int k = 0; k < 2 && i < src_.size() && src_[i] >= '0' && src_[i] <= '7'; ++k) {
              cp = cp * 8 + static_cast<uint32_t>(src_[i++] - '0');
            }
            utf8::Append(cp, &out);
          } else {
            out.push_back('\\');
            --i;  // the character after the backslash is read again as itself
          }
      }
    }
    Add(TokenType::kString, std::move(out), start);
    *p = i + 1;
    return absl::OkStatus();
  }

  absl::Status LexOperator(size_t* p, std::vector<char>* balance) {
    static constexpr absl::string_view kTwo[] = {"//", "**", "==", "!=", ">=", "<="};
    for (absl::string_view op : kTwo) {
      if (At(*p, op)) {
        Add(TokenType::kOperator, std::string(op), *p);
        *p += 2;
        return absl::OkStatus();
      }
    }
    const char c = src_[*p];
    static constexpr absl::string_view kOne = "+-/*%~[](){}><=.:|,;";
    if (kOne.find(c) == absl::string_view::npos) {
      return Error(*p, absl::StrCat("unexpected character '", std::string(1, c), "'"));
    }
    if (c == '(' || c == '[' || c == '{') {
      balance->push_back(c == '(' ? ')' : c == '[' ? ']' : '}');
    } else if (c == ')' || c == ']' || c == '}') {
      if (balance->empty()) {
        return Error(*p, absl::StrCat("unexpected '", std::string(1, c), "'"));
      }
      if (balance->back() != c) {
        return Error(*p, absl::StrCat("unexpected '", std::string(1, c), "', expected '",
                                      std::string(1, balance->back()), "'"));
      }
      balance->pop_back();
    }
    Add(TokenType::kOperator, std::string(1, c), *p);
    ++*p;
    return absl::OkStatus();
  }

  std::string src_;
  LexOptions options_;
  std::vector<size_t> line_starts_;
  std::vector<Token> tokens_;
};

// \r\n and \r become \n; one trailing newline is dropped (keep_trailing_newline=False).
std::string NormalizeNewlines(absl::string_view source) {
  std::string out;
  out.reserve(source.size());
  for (size_t i = 0; i < source.size(); ++i) {
    if (source[i] == '\r') {
      out.push_back('\n');
      if (i + 1 < source.size() && source[i + 1] == '\n') {
        ++i;
      }
    } else {
      out.push_back(source[i]);
    }
  }
  if (!out.empty() && out.back() == '\n') {
    out.pop_back();
  }
  return out;
}

}  // namespace

absl::StatusOr<std::vector<Token>> Lex(absl::string_view source, const LexOptions& options) {
  return Lexer(NormalizeNewlines(source), options).Run();
}

}  // namespace pd::chat::internal
