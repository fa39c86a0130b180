// Regular expressions (the ECMA-262 subset JSON Schema's `pattern` and `format` use) compiled
// into grammar rules.
//
// Supported: literals, `.`, classes `[...]` with ranges and negation, `\d \w \s` and their
// complements, `\xHH \uHHHH \u{H...}`, the control escapes, groups `(...)`, `(?:...)`,
// `(?<name>...)`, alternation, the quantifiers `* + ? {n} {n,} {n,m}` (lazy forms match the same
// language), and `^`/`$` at the ends of the top-level branches. Refused, with the construct
// named: backreferences, lookaround, `\b`, `\p{...}`, anchors elsewhere.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "engine/grammar/grammar.h"

namespace pd::grammar {

struct RegexOptions {
  // Search semantics (JSON Schema `pattern`): an unanchored branch may be surrounded by any
  // text. false: the whole input must match (a `format`, or a `regex` constraint).
  bool search = false;
  // Largest {n,m} bound accepted.
  int max_repeat = 1000;
  // Emits a rule matching one code point out of `ranges`. Default: Grammar::AddCodePoints (raw
  // UTF-8). The JSON Schema compiler passes one that writes JSON string escapes.
  std::function<uint32_t(Grammar*, const std::vector<CodePointRange>&)> char_class;
};

// Adds the rules for `pattern` to `grammar` and returns the rule matching it.
absl::StatusOr<uint32_t> CompileRegex(absl::string_view pattern, const RegexOptions& options,
                                      Grammar* grammar);

// Sorts, merges and complements code point ranges (within 0..0x10FFFF).
std::vector<CodePointRange> NormalizeRanges(std::vector<CodePointRange> ranges);
std::vector<CodePointRange> ComplementRanges(const std::vector<CodePointRange>& ranges);

}  // namespace pd::grammar
