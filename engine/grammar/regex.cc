#include "engine/grammar/regex.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/utf8/utf8.h"

namespace pd::grammar {
namespace {

constexpr uint32_t kMaxCodePoint = 0x10FFFF;
constexpr int kMaxNesting = 64;

const std::vector<CodePointRange>& Digits() {
  static const auto* r = new std::vector<CodePointRange>{{'0', '9'}};
  return *r;
}
const std::vector<CodePointRange>& WordChars() {
  static const auto* r =
      new std::vector<CodePointRange>{{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}};
  return *r;
}
// ECMA-262 WhiteSpace and LineTerminator.
const std::vector<CodePointRange>& SpaceChars() {
  static const auto* r = new std::vector<CodePointRange>{
      {0x09, 0x0D}, {0x20, 0x20},     {0xA0, 0xA0},     {0x1680, 0x1680}, {0x2000, 0x200A},
      {0x2028, 0x2029}, {0x202F, 0x202F}, {0x205F, 0x205F}, {0x3000, 0x3000}, {0xFEFF, 0xFEFF}};
  return *r;
}

class RegexParser {
 public:
  RegexParser(absl::string_view pattern, const RegexOptions& options, Grammar* g)
      : p_(pattern), options_(options), g_(g) {}

  absl::StatusOr<uint32_t> Run() {
    PD_ASSIGN_OR_RETURN(const uint32_t rule, ParseAlternation(0));
    if (pos_ != p_.size()) return Error("unbalanced ')'");
    return rule;
  }

 private:
  absl::Status Error(absl::string_view what) const {
    return absl::InvalidArgumentError(
        absl::StrCat("regular expression: ", what, " at offset ", pos_));
  }
  bool AtEnd() const { return pos_ >= p_.size(); }
  char Peek() const { return p_[pos_]; }

  absl::StatusOr<uint32_t> NextCodePoint() {
    const utf8::Char c = utf8::Decode(p_, pos_);
    if (!c.valid()) return Error("invalid UTF-8");
    pos_ += c.length;
    return static_cast<uint32_t>(c.code_point);
  }

  uint32_t Class(const std::vector<CodePointRange>& ranges) {
    if (options_.char_class) return options_.char_class(g_, ranges);
    return g_->AddCodePoints("char", ranges);
  }

  absl::StatusOr<uint32_t> ParseAlternation(int depth) {
    if (depth > kMaxNesting) return Error("groups nested too deeply");
    std::vector<Grammar::Sequence> branches;
    while (true) {
      PD_ASSIGN_OR_RETURN(const uint32_t branch, ParseBranch(depth));
      branches.push_back({Grammar::Ref(branch)});
      if (AtEnd() || Peek() != '|') break;
      ++pos_;
    }
    if (branches.size() == 1) return branches[0][0].index;
    return g_->AddChoice("alt", std::move(branches));
  }

  absl::StatusOr<uint32_t> ParseBranch(int depth) {
    bool anchored_start = false;
    bool anchored_end = false;
    Grammar::Sequence seq;
    if (!AtEnd() && Peek() == '^') {
      if (depth > 0) return Error("'^' inside a group is not supported");
      anchored_start = true;
      ++pos_;
    }
    while (!AtEnd() && Peek() != '|' && Peek() != ')') {
      if (Peek() == '$') {
        ++pos_;
        if (depth > 0 || (!AtEnd() && Peek() != '|')) {
          return Error("'$' before the end of the pattern is not supported");
        }
        anchored_end = true;
        break;
      }
      if (Peek() == '^') return Error("'^' after the start of the pattern is not supported");
      PD_ASSIGN_OR_RETURN(const uint32_t piece, ParsePiece(depth));
      seq.push_back(Grammar::Ref(piece));
    }
    if (depth == 0 && options_.search) {
      if (!anchored_start) seq.insert(seq.begin(), Grammar::Ref(AnyText()));
      if (!anchored_end) seq.push_back(Grammar::Ref(AnyText()));
    }
    const uint32_t rule = g_->NewRule("seq");
    g_->AddAlternative(rule, std::move(seq));
    return rule;
  }

  uint32_t AnyText() {
    if (any_text_ == UINT32_MAX) {
      const uint32_t any = Class({{0, kMaxCodePoint}});
      any_text_ = g_->AddRepeat("any", any, 0, -1);
    }
    return any_text_;
  }

  absl::StatusOr<int> ParseNumber() {
    int value = 0;
    const size_t start = pos_;
    while (!AtEnd() && Peek() >= '0' && Peek() <= '9') {
      value = value * 10 + (Peek() - '0');
      if (value > options_.max_repeat) {
        return Error(absl::StrCat("repetition bound over ", options_.max_repeat));
      }
      ++pos_;
    }
    if (pos_ == start) return -1;
    return value;
  }

  absl::StatusOr<uint32_t> ParsePiece(int depth) {
    PD_ASSIGN_OR_RETURN(uint32_t atom, ParseAtom(depth));
    while (!AtEnd()) {
      int min = 0;
      int max = -1;
      const char c = Peek();
      if (c == '*') {
        ++pos_;
      } else if (c == '+') {
        min = 1;
        ++pos_;
      } else if (c == '?') {
        max = 1;
        ++pos_;
      } else if (c == '{') {
        const size_t save = pos_;
        ++pos_;
        PD_ASSIGN_OR_RETURN(const int lo, ParseNumber());
        if (lo < 0) {  // not a quantifier: a literal '{'
          pos_ = save;
          return atom;
        }
        min = lo;
        max = lo;
        if (!AtEnd() && Peek() == ',') {
          ++pos_;
          PD_ASSIGN_OR_RETURN(const int hi, ParseNumber());
          max = hi;  // -1: unbounded
        }
        if (AtEnd() || Peek() != '}') return Error("unterminated '{' quantifier");
        ++pos_;
        if (max >= 0 && max < min) return Error("quantifier {n,m} with m < n");
      } else {
        return atom;
      }
      if (!AtEnd() && Peek() == '?') ++pos_;  // lazy: same language
      if (!AtEnd() && (Peek() == '*' || Peek() == '+' || Peek() == '?')) {
        return Error("nested quantifier");
      }
      atom = g_->AddRepeat("rep", atom, min, max);
    }
    return atom;
  }

  absl::StatusOr<uint32_t> ParseAtom(int depth) {
    const char c = Peek();
    if (c == '(') {
      ++pos_;
      if (!AtEnd() && Peek() == '?') {
        ++pos_;
        if (!AtEnd() && Peek() == ':') {
          ++pos_;
        } else if (!AtEnd() && Peek() == '<' && pos_ + 1 < p_.size() && p_[pos_ + 1] != '=' &&
                   p_[pos_ + 1] != '!') {
          const size_t close = p_.find('>', pos_);
          if (close == absl::string_view::npos) return Error("unterminated group name");
          pos_ = close + 1;
        } else {
          return Error("lookaround is not supported");
        }
      }
      PD_ASSIGN_OR_RETURN(const uint32_t inner, ParseAlternation(depth + 1));
      if (AtEnd() || Peek() != ')') return Error("missing ')'");
      ++pos_;
      return inner;
    }
    if (c == '[') return ParseClass();
    if (c == '.') {
      ++pos_;
      return Class(ComplementRanges({{'\n', '\n'}, {'\r', '\r'}, {0x2028, 0x2029}}));
    }
    if (c == '*' || c == '+' || c == '?') return Error("quantifier without an operand");
    if (c == '\\') {
      std::vector<CodePointRange> ranges;
      PD_RETURN_IF_ERROR(ParseEscape(/*in_class=*/false, &ranges));
      return Class(ranges);
    }
    PD_ASSIGN_OR_RETURN(const uint32_t cp, NextCodePoint());
    return Class({{cp, cp}});
  }

  // Parses an escape after '\\' into `ranges`.
  absl::Status ParseEscape(bool in_class, std::vector<CodePointRange>* ranges) {
    ++pos_;  // the backslash
    if (AtEnd()) return Error("trailing backslash");
    const char e = Peek();
    ++pos_;
    auto add = [&](const std::vector<CodePointRange>& r) {
      ranges->insert(ranges->end(), r.begin(), r.end());
    };
    auto one = [&](uint32_t cp) { ranges->push_back({cp, cp}); };
    switch (e) {
      case 'd': add(Digits()); return absl::OkStatus();
      case 'D': add(ComplementRanges(Digits())); return absl::OkStatus();
      case 'w': add(WordChars()); return absl::OkStatus();
      case 'W': add(ComplementRanges(WordChars())); return absl::OkStatus();
      case 's': add(SpaceChars()); return absl::OkStatus();
      case 'S': add(ComplementRanges(SpaceChars())); return absl::OkStatus();
      case 'n': one('\n'); return absl::OkStatus();
      case 'r': one('\r'); return absl::OkStatus();
      case 't': one('\t'); return absl::OkStatus();
      case 'f': one('\f'); return absl::OkStatus();
      case 'v': one('\v'); return absl::OkStatus();
      case '0': one(0); return absl::OkStatus();
      case 'b':
        if (in_class) {
          one('\b');
          return absl::OkStatus();
        }
        return Error("'\\b' (word boundary) is not supported");
      case 'B': return Error("'\\B' is not supported");
      case 'p':
      case 'P': return Error("Unicode property escapes are not supported");
      case 'x':
      case 'u': {
        uint32_t cp = 0;
        if (e == 'u' && !AtEnd() && Peek() == '{') {
          const size_t close = p_.find('}', pos_);
          if (close == absl::string_view::npos) return Error("unterminated '\\u{'");
          PD_ASSIGN_OR_RETURN(cp, Hex(p_.substr(pos_ + 1, close - pos_ - 1)));
          pos_ = close + 1;
        } else {
          const size_t n = e == 'x' ? 2 : 4;
          if (pos_ + n > p_.size()) return Error("short hex escape");
          PD_ASSIGN_OR_RETURN(cp, Hex(p_.substr(pos_, n)));
          pos_ += n;
        }
        if (cp > kMaxCodePoint) return Error("code point over U+10FFFF");
        one(cp);
        return absl::OkStatus();
      }
      default:
        if (e >= '1' && e <= '9') return Error("backreferences are not supported");
        if ((e >= 'a' && e <= 'z') || (e >= 'A' && e <= 'Z')) {
          return Error(absl::StrCat("unknown escape '\\", std::string(1, e), "'"));
        }
        --pos_;
        PD_ASSIGN_OR_RETURN(const uint32_t cp, NextCodePoint());
        one(cp);
        return absl::OkStatus();
    }
  }

  absl::StatusOr<uint32_t> Hex(absl::string_view digits) const {
    if (digits.empty() || digits.size() > 6) return Error("bad hex escape");
    uint32_t v = 0;
    for (const char c : digits) {
      int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10
                                              : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
      if (d < 0) return Error("bad hex escape");
      v = v * 16 + static_cast<uint32_t>(d);
    }
    return v;
  }

  absl::StatusOr<uint32_t> ParseClass() {
    ++pos_;  // '['
    bool negate = false;
    if (!AtEnd() && Peek() == '^') {
      negate = true;
      ++pos_;
    }
    std::vector<CodePointRange> ranges;
    bool first = true;
    while (true) {
      if (AtEnd()) return Error("unterminated character class");
      if (Peek() == ']' && !first) break;
      first = false;
      std::vector<CodePointRange> item;
      if (Peek() == '\\') {
        PD_RETURN_IF_ERROR(ParseEscape(/*in_class=*/true, &item));
      } else {
        PD_ASSIGN_OR_RETURN(const uint32_t cp, NextCodePoint());
        item.push_back({cp, cp});
      }
      // A range a-b (a single character on each side).
      if (item.size() == 1 && item[0].lo == item[0].hi && pos_ + 1 < p_.size() && Peek() == '-' &&
          p_[pos_ + 1] != ']') {
        ++pos_;
        std::vector<CodePointRange> hi_item;
        if (Peek() == '\\') {
          PD_RETURN_IF_ERROR(ParseEscape(/*in_class=*/true, &hi_item));
        } else {
          PD_ASSIGN_OR_RETURN(const uint32_t cp, NextCodePoint());
          hi_item.push_back({cp, cp});
        }
        if (hi_item.size() != 1 || hi_item[0].lo != hi_item[0].hi) {
          return Error("class range with a class as its end");
        }
        if (hi_item[0].lo < item[0].lo) return Error("class range out of order");
        item[0].hi = hi_item[0].lo;
      }
      ranges.insert(ranges.end(), item.begin(), item.end());
    }
    ++pos_;  // ']'
    ranges = NormalizeRanges(std::move(ranges));
    if (negate) ranges = ComplementRanges(ranges);
    if (ranges.empty()) return Error("character class matches nothing");
    return Class(ranges);
  }

  absl::string_view p_;
  size_t pos_ = 0;
  const RegexOptions& options_;
  Grammar* g_;
  uint32_t any_text_ = UINT32_MAX;
};

}  // namespace

std::vector<CodePointRange> NormalizeRanges(std::vector<CodePointRange> ranges) {
  std::sort(ranges.begin(), ranges.end(),
            [](const CodePointRange& a, const CodePointRange& b) { return a.lo < b.lo; });
  std::vector<CodePointRange> out;
  for (const CodePointRange& r : ranges) {
    if (!out.empty() && r.lo <= out.back().hi + 1) {
      out.back().hi = std::max(out.back().hi, r.hi);
    } else {
      out.push_back(r);
    }
  }
  return out;
}

std::vector<CodePointRange> ComplementRanges(const std::vector<CodePointRange>& ranges) {
  std::vector<CodePointRange> sorted = NormalizeRanges(ranges);
  std::vector<CodePointRange> out;
  uint32_t next = 0;
  for (const CodePointRange& r : sorted) {
    if (r.lo > next) out.push_back({next, r.lo - 1});
    next = r.hi + 1;
  }
  if (next <= kMaxCodePoint) out.push_back({next, kMaxCodePoint});
  return out;
}

absl::StatusOr<uint32_t> CompileRegex(absl::string_view pattern, const RegexOptions& options,
                                      Grammar* grammar) {
  RegexParser parser(pattern, options, grammar);
  return parser.Run();
}

}  // namespace pd::grammar
