// A context-free grammar over bytes: the one representation every constraint form (JSON
// Schema, regular expression, choice list, EBNF) compiles to, and that the Matcher runs.
//
// A grammar is a list of rules; a rule is a list of alternatives; an alternative is a sequence
// of elements, each either a byte set (one byte out of a 256-bit set) or a reference to a rule.
// Working on bytes, not code points, makes token masks exact for byte-level vocabularies: a
// token that ends inside a multi-byte UTF-8 character is allowed exactly when its bytes are a
// prefix of a character the grammar accepts. Code point classes are compiled to UTF-8 byte
// sequences by AddCodePoints (the construction of RE2's and Rust's utf8-ranges).
//
// The grammar must not be left-recursive (a rule reaching itself before consuming a byte):
// Validate refuses it. Everything this folder compiles is right-recursive by construction.
// docs/structured-outputs.md describes the design and its reasons.
#pragma once

#include <bitset>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace pd::grammar {

using ByteSet = std::bitset<256>;

// Special tokens as grammar terminals. A control token (Mistral's `[TOOL_CALLS]`, say) decodes
// to no text, so a grammar over bytes could not name it. A grammar writes special token T as
// the bytes 0xFF, T's text, 0xFF (SpecialTokenBytes), and the token trie gives T exactly those
// bytes. No UTF-8 text contains the byte 0xFF, so no ordinary text can spell a special token:
// the trie gives no bytes (never allowed) to an ordinary token whose bytes contain 0xFF (a
// byte-fallback token, never valid UTF-8), and every rule of this folder that reads "any
// byte" (a structural tag's free text, a reasoning block) leaves 0xFF out, so a special token
// is allowed exactly where a grammar writes it.
inline constexpr uint8_t kSpecialTokenMark = 0xFF;
// 0xFF + text + 0xFF.
std::string SpecialTokenBytes(absl::string_view text);

// One code point range, inclusive.
struct CodePointRange {
  uint32_t lo = 0;
  uint32_t hi = 0;
};

struct Element {
  enum class Kind : uint8_t { kBytes, kRule, kEnd };
  Kind kind = Kind::kEnd;
  uint32_t index = 0;  // kBytes: index into Grammar::sets(); kRule: rule id
};

class Grammar {
 public:
  using Sequence = std::vector<Element>;

  // Declares a rule with no alternatives yet and returns its id; `name` is for errors and dumps.
  uint32_t NewRule(absl::string_view name);
  // Adds an alternative (possibly empty: the rule matches the empty string).
  void AddAlternative(uint32_t rule, Sequence sequence);

  // Element builders.
  Element Bytes(const ByteSet& set);
  Element Byte(uint8_t byte);
  static Element Ref(uint32_t rule) { return Element{Element::Kind::kRule, rule}; }
  // The bytes of `text`, one element each.
  Sequence Literal(absl::string_view text);

  // A new rule matching one code point in `ranges` (each within 0..0x10FFFF, surrogates
  // excluded), encoded as UTF-8.
  uint32_t AddCodePoints(absl::string_view name, const std::vector<CodePointRange>& ranges);
  // A new rule matching `inner` repeated between min and max times (max < 0: unbounded).
  uint32_t AddRepeat(absl::string_view name, uint32_t inner, int min, int max);
  // A new rule matching one of `alternatives`.
  uint32_t AddChoice(absl::string_view name, std::vector<Sequence> alternatives);

  // Copies every rule of `other` into this grammar (renumbered, names kept) and returns the id
  // its root has here: a grammar embedded in another, as a structural tag embeds a schema's.
  uint32_t Import(const Grammar& other);

  void set_root(uint32_t rule) { root_ = rule; }
  uint32_t root() const { return root_; }

  // Refuses undefined references, rules without alternatives that are referenced, and left
  // recursion (naming the rule). Must pass before a Matcher is built.
  absl::Status Validate() const;

  // Read access for the matcher.
  size_t num_rules() const { return rules_.size(); }
  const std::vector<Sequence>& alternatives(uint32_t rule) const { return rules_[rule]; }
  const std::string& rule_name(uint32_t rule) const { return names_[rule]; }
  const std::vector<ByteSet>& sets() const { return sets_; }
  // Total number of elements, a size measure for limits.
  size_t num_elements() const { return num_elements_; }

  // A readable EBNF-like dump, for tests and debugging.
  std::string ToString() const;

 private:
  std::vector<std::vector<Sequence>> rules_;
  std::vector<std::string> names_;
  std::vector<ByteSet> sets_;
  size_t num_elements_ = 0;
  uint32_t root_ = 0;
};

}  // namespace pd::grammar
