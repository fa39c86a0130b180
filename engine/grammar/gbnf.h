// Grammars written by hand, in GBNF (llama.cpp's EBNF dialect, also what vLLM's
// `guided_grammar` takes), compiled into a Grammar (docs/structured-outputs.md, "Grammars").
//
//   root   ::= "{" ws pair ("," ws pair)* "}"
//   pair   ::= name ":" ws [0-9]+     # a comment runs to the end of the line
//   name   ::= "\"" [a-z_]{1,16} "\""
//   ws     ::= [ \t\n]?
//
// A rule is `name ::= alternatives`; names are letters, digits, `-` and `_`. A definition runs
// until the next `name ::=`, so rules may span lines. Elements: "literal" and 'literal' (escapes
// \n \r \t \\ \" \' \xHH \uHHHH \UHHHHHHHH), [character classes] with ranges, `^` negation and
// the same escapes, `.` (any character), rule names, ( groups ), and the quantifiers * + ?
// {n} {n,} {n,m} on any element. The output must match the rule named `root`.
//
// Refused with a message naming the line and column: syntax errors, a rule used but not
// defined or defined twice, no `root`, left recursion (`expr ::= expr "+" term`: write it
// right-recursive), repetition bounds above max_repeat, and grammars that expand to more than
// max_elements elements.
#pragma once

#include <cstddef>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "engine/grammar/grammar.h"

namespace pd::grammar {

struct GbnfOptions {
  int max_repeat = 1000;                   // largest {n,m} bound
  size_t max_elements = size_t{1} << 20;   // after repetitions are expanded
  int max_nesting = 64;                    // ( groups ) inside each other
};

absl::StatusOr<Grammar> CompileGbnf(absl::string_view text, const GbnfOptions& options = {});

}  // namespace pd::grammar
