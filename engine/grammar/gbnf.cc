#include "engine/grammar/gbnf.h"

#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/utf8/utf8.h"
#include "engine/grammar/regex.h"

namespace pd::grammar {
namespace {

constexpr uint32_t kMaxCodePoint = 0x10FFFF;

bool IsNameChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
         c == '_';
}

class GbnfParser {
 public:
  GbnfParser(absl::string_view text, const GbnfOptions& options) : t_(text), options_(options) {}

  absl::StatusOr<Grammar> Run() {
    SkipSpace();
    if (AtEnd()) return Error("the grammar is empty (it needs a rule named root)");
    while (!AtEnd()) {
      const size_t at = pos_;
      const std::string name = ParseName();
      if (name.empty()) return Error("expected a rule name");
      SkipBlanks();
      if (t_.substr(pos_, 3) != "::=") {
        return Error(absl::StrCat("expected '::=' after the rule name '", name, "'"));
      }
      pos_ += 3;
      const uint32_t rule = RuleId(name);
      if (defined_.contains(rule)) {
        pos_ = at;
        return Error(absl::StrCat("rule '", name, "' is defined twice"));
      }
      defined_[rule] = at;
      PD_ASSIGN_OR_RETURN(std::vector<Grammar::Sequence> alternatives, ParseAlternatives(0));
      for (Grammar::Sequence& alt : alternatives) g_.AddAlternative(rule, std::move(alt));
      SkipSpace();
    }
    for (const auto& [rule, at] : uses_) {
      if (!defined_.contains(rule)) {
        pos_ = at;
        return Error(absl::StrCat("rule '", g_.rule_name(rule), "' is used but not defined"));
      }
    }
    const auto root = ids_.find("root");
    if (root == ids_.end() || !defined_.contains(root->second)) {
      return absl::InvalidArgumentError("grammar: no rule named 'root' (the output matches root)");
    }
    g_.set_root(root->second);
    if (absl::Status valid = g_.Validate(); !valid.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "grammar: ", valid.message(),
          absl::StrContains(valid.message(), "left-recursive")
              ? " (a rule may not start with itself: write the repetition right-recursive or "
                "with * and +)"
              : ""));
    }
    return std::move(g_);
  }

 private:
  absl::Status Error(absl::string_view what) const {
    size_t line = 1;
    size_t column = 1;
    for (size_t i = 0; i < pos_ && i < t_.size(); ++i) {
      if (t_[i] == '\n') {
        ++line;
        column = 1;
      } else {
        ++column;
      }
    }
    return absl::InvalidArgumentError(
        absl::StrCat("grammar: line ", line, ", column ", column, ": ", what));
  }
  bool AtEnd() const { return pos_ >= t_.size(); }
  char Peek() const { return t_[pos_]; }

  // Blanks, newlines and # comments.
  void SkipSpace() {
    while (!AtEnd()) {
      const char c = Peek();
      if (c == ' ' || c == '\t' || c == '\r' || c == '\n') {
        ++pos_;
      } else if (c == '#') {
        while (!AtEnd() && Peek() != '\n') ++pos_;
      } else {
        break;
      }
    }
  }
  void SkipBlanks() {
    while (!AtEnd() && (Peek() == ' ' || Peek() == '\t')) ++pos_;
  }

  std::string ParseName() {
    const size_t start = pos_;
    while (!AtEnd() && IsNameChar(Peek())) ++pos_;
    return std::string(t_.substr(start, pos_ - start));
  }

  // Whether a definition `name ::=` starts here (the current one ends before it).
  bool AtDefinition() const {
    size_t p = pos_;
    while (p < t_.size() && IsNameChar(t_[p])) ++p;
    if (p == pos_) return false;
    while (p < t_.size() && (t_[p] == ' ' || t_[p] == '\t')) ++p;
    return t_.substr(p, 3) == "::=";
  }

  uint32_t RuleId(const std::string& name) {
    auto [it, added] = ids_.try_emplace(name, 0);
    if (added) it->second = g_.NewRule(name);
    return it->second;
  }

  absl::Status CheckSize() const {
    if (g_.num_elements() > options_.max_elements) {
      return Error(absl::StrCat("the grammar expands to more than ", options_.max_elements,
                                " elements (repetitions are expanded); make it smaller"));
    }
    return absl::OkStatus();
  }

  absl::StatusOr<std::vector<Grammar::Sequence>> ParseAlternatives(int depth) {
    std::vector<Grammar::Sequence> alternatives;
    while (true) {
      PD_ASSIGN_OR_RETURN(Grammar::Sequence seq, ParseSequence(depth));
      alternatives.push_back(std::move(seq));
      SkipSpace();
      if (AtEnd() || Peek() != '|') break;
      ++pos_;
    }
    return alternatives;
  }

  absl::StatusOr<Grammar::Sequence> ParseSequence(int depth) {
    Grammar::Sequence seq;
    while (true) {
      SkipSpace();
      if (AtEnd() || Peek() == '|' || Peek() == ')') break;
      if (depth == 0 && AtDefinition()) break;
      const size_t at = pos_;
      PD_ASSIGN_OR_RETURN(Grammar::Sequence element, ParseElement(depth));
      PD_ASSIGN_OR_RETURN(element, ParseQuantifier(at, std::move(element)));
      seq.insert(seq.end(), element.begin(), element.end());
    }
    return seq;
  }

  absl::StatusOr<Grammar::Sequence> ParseElement(int depth) {
    const char c = Peek();
    if (c == '"' || c == '\'') {
      PD_ASSIGN_OR_RETURN(const std::string bytes, ParseLiteral());
      return g_.Literal(bytes);
    }
    if (c == '[') {
      PD_ASSIGN_OR_RETURN(const uint32_t rule, ParseClass());
      return Grammar::Sequence{Grammar::Ref(rule)};
    }
    if (c == '.') {
      ++pos_;
      return Grammar::Sequence{Grammar::Ref(g_.AddCodePoints("any", {{0, kMaxCodePoint}}))};
    }
    if (c == '(') {
      if (depth + 1 > options_.max_nesting) return Error("groups nested too deeply");
      ++pos_;
      PD_ASSIGN_OR_RETURN(std::vector<Grammar::Sequence> alternatives, ParseAlternatives(depth + 1));
      if (AtEnd() || Peek() != ')') return Error("expected ')'");
      ++pos_;
      if (alternatives.size() == 1) return std::move(alternatives[0]);
      return Grammar::Sequence{Grammar::Ref(g_.AddChoice("group", std::move(alternatives)))};
    }
    if (IsNameChar(c)) {
      const size_t at = pos_;
      const uint32_t rule = RuleId(ParseName());
      uses_.emplace_back(rule, at);
      return Grammar::Sequence{Grammar::Ref(rule)};
    }
    if (c == ':' && t_.substr(pos_, 3) == "::=") {
      return Error("'::=' without a rule name before it on this definition");
    }
    return Error(absl::StrCat("unexpected '", std::string(1, c), "'"));
  }

  // A quantifier after the element that started at `at`, if any.
  absl::StatusOr<Grammar::Sequence> ParseQuantifier(size_t at, Grammar::Sequence element) {
    if (AtEnd()) return element;
    int min = 0;
    int max = 0;
    const char c = Peek();
    if (c == '*') {
      min = 0, max = -1;
      ++pos_;
    } else if (c == '+') {
      min = 1, max = -1;
      ++pos_;
    } else if (c == '?') {
      min = 0, max = 1;
      ++pos_;
    } else if (c == '{') {
      ++pos_;
      PD_ASSIGN_OR_RETURN(min, ParseCount());
      max = min;
      if (!AtEnd() && Peek() == ',') {
        ++pos_;
        SkipBlanks();
        if (!AtEnd() && Peek() == '}') {
          max = -1;
        } else {
          PD_ASSIGN_OR_RETURN(max, ParseCount());
        }
      }
      SkipBlanks();
      if (AtEnd() || Peek() != '}') return Error("expected '}' closing the repetition");
      ++pos_;
      if (max >= 0 && max < min) {
        return Error(absl::StrCat("repetition {", min, ",", max, "}: the bound is below the count"));
      }
    } else {
      return element;
    }
    uint32_t inner = 0;
    if (element.size() == 1 && element[0].kind == Element::Kind::kRule) {
      inner = element[0].index;
    } else {
      inner = g_.NewRule("item");
      g_.AddAlternative(inner, std::move(element));
    }
    if (min == 0 && max == 0) return Grammar::Sequence{};
    const uint32_t rule = g_.AddRepeat("repeat", inner, min, max);
    if (absl::Status size = CheckSize(); !size.ok()) {
      pos_ = at;
      return size;
    }
    return Grammar::Sequence{Grammar::Ref(rule)};
  }

  absl::StatusOr<int> ParseCount() {
    SkipBlanks();
    const size_t start = pos_;
    int64_t n = 0;
    while (!AtEnd() && Peek() >= '0' && Peek() <= '9') {
      n = n * 10 + (Peek() - '0');
      ++pos_;
      if (n > options_.max_repeat) {
        pos_ = start;
        return Error(absl::StrCat("repetition bound above ", options_.max_repeat));
      }
    }
    if (pos_ == start) return Error("expected a number in the repetition");
    SkipBlanks();
    return static_cast<int>(n);
  }

  // One character of a literal or class: an escape or a UTF-8 code point.
  absl::StatusOr<uint32_t> ParseChar() {
    if (Peek() != '\\') {
      const utf8::Char ch = utf8::Decode(t_, pos_);
      if (!ch.valid()) return Error("invalid UTF-8");
      pos_ += ch.length;
      return static_cast<uint32_t>(ch.code_point);
    }
    ++pos_;
    if (AtEnd()) return Error("an escape at the end of the grammar");
    const char e = Peek();
    ++pos_;
    switch (e) {
      case 'n':
        return '\n';
      case 'r':
        return '\r';
      case 't':
        return '\t';
      case '\\':
      case '"':
      case '\'':
      case '[':
      case ']':
      case '-':
      case '^':
        return static_cast<uint32_t>(e);
      case 'x':
        return ParseHex(2);
      case 'u':
        return ParseHex(4);
      case 'U':
        return ParseHex(8);
      default:
        --pos_;
        return Error(absl::StrCat("unknown escape '\\", std::string(1, e), "'"));
    }
  }

  absl::StatusOr<uint32_t> ParseHex(int digits) {
    uint32_t v = 0;
    for (int i = 0; i < digits; ++i) {
      if (AtEnd()) return Error("a \\x, \\u or \\U escape cut short");
      const char h = Peek();
      uint32_t d = 0;
      if (h >= '0' && h <= '9') {
        d = static_cast<uint32_t>(h - '0');
      } else if (h >= 'a' && h <= 'f') {
        d = static_cast<uint32_t>(h - 'a' + 10);
      } else if (h >= 'A' && h <= 'F') {
        d = static_cast<uint32_t>(h - 'A' + 10);
      } else {
        return Error("expected a hexadecimal digit");
      }
      v = v * 16 + d;
      ++pos_;
    }
    if (v > kMaxCodePoint || (v >= 0xD800 && v <= 0xDFFF)) {
      return Error("the escape is not a Unicode character (a surrogate or above U+10FFFF)");
    }
    return v;
  }

  absl::StatusOr<std::string> ParseLiteral() {
    const char quote = Peek();
    ++pos_;
    std::string bytes;
    while (true) {
      if (AtEnd() || Peek() == '\n') return Error("a literal without its closing quote");
      if (Peek() == quote) {
        ++pos_;
        return bytes;
      }
      PD_ASSIGN_OR_RETURN(const uint32_t cp, ParseChar());
      utf8::Append(cp, &bytes);
    }
  }

  absl::StatusOr<uint32_t> ParseClass() {
    const size_t at = pos_;
    ++pos_;  // '['
    bool negate = false;
    if (!AtEnd() && Peek() == '^') {
      negate = true;
      ++pos_;
    }
    std::vector<CodePointRange> ranges;
    while (true) {
      if (AtEnd()) {
        pos_ = at;
        return Error("a character class without its closing ']'");
      }
      if (Peek() == ']') {
        ++pos_;
        break;
      }
      PD_ASSIGN_OR_RETURN(const uint32_t lo, ParseChar());
      uint32_t hi = lo;
      if (pos_ + 1 < t_.size() && Peek() == '-' && t_[pos_ + 1] != ']') {
        ++pos_;
        PD_ASSIGN_OR_RETURN(hi, ParseChar());
        if (hi < lo) return Error("a character range whose end is below its start");
      }
      ranges.push_back({lo, hi});
    }
    ranges = NormalizeRanges(std::move(ranges));
    if (negate) ranges = ComplementRanges(ranges);
    // Surrogates are no characters: a class of nothing else matches nothing.
    bool any = false;
    for (const CodePointRange& r : ranges) {
      any = any || r.lo < 0xD800 || r.hi > 0xDFFF;
    }
    if (!any) {
      pos_ = at;
      return Error("a character class that matches no character");
    }
    return g_.AddCodePoints("class", ranges);
  }

  absl::string_view t_;
  const GbnfOptions& options_;
  size_t pos_ = 0;
  Grammar g_;
  absl::flat_hash_map<std::string, uint32_t> ids_;
  absl::flat_hash_map<uint32_t, size_t> defined_;    // rule -> where it is defined
  std::vector<std::pair<uint32_t, size_t>> uses_;    // (rule, where), in the text's order
};

}  // namespace

absl::StatusOr<Grammar> CompileGbnf(absl::string_view text, const GbnfOptions& options) {
  return GbnfParser(text, options).Run();
}

}  // namespace pd::grammar
