// Parser of the Jinja2 subset (engine/chat/jinja.h): tokens from lexer.h to the tree of ast.h,
// with Jinja2's grammar and operator precedence (or < and < not < comparisons and tests' `in`
// < + - < ~ < * / // % < ** (left-associative, as in Jinja2) < unary - + < filters, tests,
// attribute, subscript and call). Internal to engine/chat. Thread-safe (pure function).
#pragma once

#include <vector>

#include "absl/status/statusor.h"
#include "engine/chat/ast.h"
#include "engine/chat/lexer.h"

namespace pd::chat::internal {

// The template's statements. InvalidArgument ("line L, column C: ...") for a syntax error,
// an unknown tag, an unclosed block or nesting deeper than `max_depth` (expressions and blocks
// together), which bounds the recursion of the parser and of every later tree walk.
absl::StatusOr<StmtList> Parse(std::vector<Token> tokens, int max_depth);

}  // namespace pd::chat::internal
