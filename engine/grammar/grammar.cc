#include "engine/grammar/grammar.h"

#include <functional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/utf8/utf8.h"

namespace pd::grammar {
namespace {

// One UTF-8 sequence of byte ranges: byte i of the encoding lies in ranges[i].
using ByteRangeSeq = std::vector<std::pair<uint8_t, uint8_t>>;

// Splits [lo, hi] (no surrogates inside) into ranges whose encodings are byte-range sequences.
void SplitUtf8(uint32_t lo, uint32_t hi, std::vector<ByteRangeSeq>* out) {
  for (const uint32_t boundary : {0x7Fu, 0x7FFu, 0xFFFFu}) {
    if (lo <= boundary && boundary < hi) {
      SplitUtf8(lo, boundary, out);
      SplitUtf8(boundary + 1, hi, out);
      return;
    }
  }
  for (int i = 1; i < 4; ++i) {
    const uint32_t m = (1u << (6 * i)) - 1;
    if ((lo & ~m) != (hi & ~m)) {
      if ((lo & m) != 0) {
        SplitUtf8(lo, lo | m, out);
        SplitUtf8((lo | m) + 1, hi, out);
        return;
      }
      if ((hi & m) != m) {
        SplitUtf8(lo, (hi & ~m) - 1, out);
        SplitUtf8(hi & ~m, hi, out);
        return;
      }
    }
  }
  std::string a;
  std::string b;
  utf8::Append(lo, &a);
  utf8::Append(hi, &b);
  ByteRangeSeq seq;
  for (size_t i = 0; i < a.size(); ++i) {
    seq.emplace_back(static_cast<uint8_t>(a[i]), static_cast<uint8_t>(b[i]));
  }
  out->push_back(std::move(seq));
}

}  // namespace

std::string SpecialTokenBytes(absl::string_view text) {
  const auto mark = static_cast<char>(kSpecialTokenMark);
  return absl::StrCat(absl::string_view(&mark, 1), text, absl::string_view(&mark, 1));
}

uint32_t Grammar::NewRule(absl::string_view name) {
  rules_.emplace_back();
  names_.emplace_back(name);
  return static_cast<uint32_t>(rules_.size() - 1);
}

void Grammar::AddAlternative(uint32_t rule, Sequence sequence) {
  num_elements_ += sequence.size() + 1;
  rules_[rule].push_back(std::move(sequence));
}

uint32_t Grammar::Import(const Grammar& other) {
  const auto offset = static_cast<uint32_t>(rules_.size());
  std::vector<Element> sets;  // other's set i, as an element of this grammar
  sets.reserve(other.sets_.size());
  for (const ByteSet& set : other.sets_) sets.push_back(Bytes(set));
  for (size_t r = 0; r < other.rules_.size(); ++r) NewRule(other.names_[r]);
  for (size_t r = 0; r < other.rules_.size(); ++r) {
    for (const Sequence& alternative : other.rules_[r]) {
      Sequence seq;
      seq.reserve(alternative.size());
      for (const Element& e : alternative) {
        seq.push_back(e.kind == Element::Kind::kBytes  ? sets[e.index]
                      : e.kind == Element::Kind::kRule ? Ref(e.index + offset)
                                                       : e);
      }
      AddAlternative(offset + static_cast<uint32_t>(r), std::move(seq));
    }
  }
  return other.root_ + offset;
}

Element Grammar::Bytes(const ByteSet& set) {
  for (size_t i = 0; i < sets_.size(); ++i) {
    if (sets_[i] == set) return Element{Element::Kind::kBytes, static_cast<uint32_t>(i)};
  }
  sets_.push_back(set);
  return Element{Element::Kind::kBytes, static_cast<uint32_t>(sets_.size() - 1)};
}

Element Grammar::Byte(uint8_t byte) {
  ByteSet set;
  set.set(byte);
  return Bytes(set);
}

Grammar::Sequence Grammar::Literal(absl::string_view text) {
  Sequence seq;
  seq.reserve(text.size());
  for (const char c : text) seq.push_back(Byte(static_cast<uint8_t>(c)));
  return seq;
}

uint32_t Grammar::AddCodePoints(absl::string_view name, const std::vector<CodePointRange>& ranges) {
  std::vector<ByteRangeSeq> seqs;
  for (const CodePointRange& r : ranges) {
    uint32_t lo = r.lo;
    const uint32_t hi = r.hi > 0x10FFFF ? 0x10FFFF : r.hi;
    if (lo > hi) continue;
    // Surrogates are not characters: cut them out.
    if (lo < 0xD800 && hi >= 0xD800) {
      SplitUtf8(lo, std::min<uint32_t>(hi, 0xD7FF), &seqs);
      lo = 0xE000;
    } else if (lo >= 0xD800 && lo <= 0xDFFF) {
      lo = 0xE000;
    }
    if (lo <= hi) SplitUtf8(lo, hi, &seqs);
  }
  const uint32_t rule = NewRule(name);
  // Single bytes merge into one set; longer sequences become one alternative each.
  ByteSet ascii;
  for (const ByteRangeSeq& seq : seqs) {
    if (seq.size() == 1) {
      for (int b = seq[0].first; b <= seq[0].second; ++b) ascii.set(b);
      continue;
    }
    Sequence alt;
    for (const auto& [lo, hi] : seq) {
      ByteSet set;
      for (int b = lo; b <= hi; ++b) set.set(b);
      alt.push_back(Bytes(set));
    }
    AddAlternative(rule, std::move(alt));
  }
  if (ascii.any()) AddAlternative(rule, {Bytes(ascii)});
  return rule;
}

uint32_t Grammar::AddRepeat(absl::string_view name, uint32_t inner, int min, int max) {
  const uint32_t rule = NewRule(name);
  Sequence seq(static_cast<size_t>(min), Ref(inner));
  if (max < 0) {
    const uint32_t star = NewRule(absl::StrCat(name, "*"));
    AddAlternative(star, {Ref(inner), Ref(star)});
    AddAlternative(star, {});
    seq.push_back(Ref(star));
  } else if (max > min) {
    // opt_k matches 0..k more: opt_k ::= inner opt_{k-1} | ε.
    uint32_t tail = NewRule(absl::StrCat(name, "?1"));
    AddAlternative(tail, {Ref(inner)});
    AddAlternative(tail, {});
    for (int k = 2; k <= max - min; ++k) {
      const uint32_t next = NewRule(absl::StrCat(name, "?", k));
      AddAlternative(next, {Ref(inner), Ref(tail)});
      AddAlternative(next, {});
      tail = next;
    }
    seq.push_back(Ref(tail));
  }
  AddAlternative(rule, std::move(seq));
  return rule;
}

uint32_t Grammar::AddChoice(absl::string_view name, std::vector<Sequence> alternatives) {
  const uint32_t rule = NewRule(name);
  for (Sequence& alt : alternatives) AddAlternative(rule, std::move(alt));
  return rule;
}

absl::Status Grammar::Validate() const {
  if (root_ >= rules_.size()) return absl::InvalidArgumentError("grammar has no root rule");
  for (size_t r = 0; r < rules_.size(); ++r) {
    for (const Sequence& alt : rules_[r]) {
      for (const Element& e : alt) {
        if (e.kind == Element::Kind::kRule) {
          if (e.index >= rules_.size()) {
            return absl::InvalidArgumentError(
                absl::StrCat("rule '", names_[r], "' refers to an undefined rule"));
          }
          if (rules_[e.index].empty()) {
            return absl::InvalidArgumentError(
                absl::StrCat("rule '", names_[e.index], "' has no alternatives"));
          }
        } else if (e.kind != Element::Kind::kBytes || e.index >= sets_.size()) {
          return absl::InvalidArgumentError(
              absl::StrCat("rule '", names_[r], "' has a malformed element"));
        }
      }
    }
  }
  // Nullable rules, by fixpoint.
  std::vector<bool> nullable(rules_.size(), false);
  for (bool changed = true; changed;) {
    changed = false;
    for (size_t r = 0; r < rules_.size(); ++r) {
      if (nullable[r]) continue;
      for (const Sequence& alt : rules_[r]) {
        bool all = true;
        for (const Element& e : alt) {
          if (e.kind != Element::Kind::kRule || !nullable[e.index]) {
            all = false;
            break;
          }
        }
        if (all) {
          nullable[r] = true;
          changed = true;
          break;
        }
      }
    }
  }
  // Left edges: r -> s when s can be reached before r consumes a byte. A cycle is left
  // recursion, which would make the matcher expand forever.
  std::vector<std::vector<uint32_t>> left(rules_.size());
  for (size_t r = 0; r < rules_.size(); ++r) {
    for (const Sequence& alt : rules_[r]) {
      for (const Element& e : alt) {
        if (e.kind != Element::Kind::kRule) break;
        left[r].push_back(e.index);
        if (!nullable[e.index]) break;
      }
    }
  }
  std::vector<uint8_t> color(rules_.size(), 0);  // 0 new, 1 on the path, 2 done
  std::vector<std::pair<uint32_t, size_t>> stack;
  for (uint32_t start = 0; start < rules_.size(); ++start) {
    if (color[start] != 0) continue;
    stack.emplace_back(start, 0);
    color[start] = 1;
    while (!stack.empty()) {
      auto& [r, next] = stack.back();
      if (next == left[r].size()) {
        color[r] = 2;
        stack.pop_back();
        continue;
      }
      const uint32_t s = left[r][next++];
      if (color[s] == 1) {
        return absl::InvalidArgumentError(
            absl::StrCat("rule '", names_[s], "' is left-recursive"));
      }
      if (color[s] == 0) {
        color[s] = 1;
        stack.emplace_back(s, 0);
      }
    }
  }
  return absl::OkStatus();
}

std::string Grammar::ToString() const {
  auto set_text = [](const ByteSet& set) {
    std::string out = "[";
    for (int b = 0; b < 256; ++b) {
      if (!set.test(b)) continue;
      int e = b;
      while (e + 1 < 256 && set.test(e + 1)) ++e;
      auto one = [](int c) {
        return c >= 0x21 && c < 0x7F && c != ']' && c != '\\' && c != '-'
                   ? std::string(1, static_cast<char>(c))
                   : absl::StrFormat("\\x%02X", c);
      };
      out += one(b);
      if (e > b) out += "-" + one(e);
      b = e;
    }
    return out + "]";
  };
  std::string out;
  for (size_t r = 0; r < rules_.size(); ++r) {
    absl::StrAppend(&out, names_[r], r == root_ ? " (root)" : "", " ::=");
    for (size_t a = 0; a < rules_[r].size(); ++a) {
      if (a > 0) out += " |";
      if (rules_[r][a].empty()) out += " ε";
      for (const Element& e : rules_[r][a]) {
        out += " ";
        out += e.kind == Element::Kind::kRule ? names_[e.index] : set_text(sets_[e.index]);
      }
    }
    out += "\n";
  }
  return out;
}

}  // namespace pd::grammar
