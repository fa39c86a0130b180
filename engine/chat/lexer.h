// Lexer of the Jinja2 subset (engine/chat/jinja.h): splits a template into text and the tokens
// of its tags, applying Jinja2's whitespace rules on the way (`{%-`/`-%}` and friends,
// trim_blocks, lstrip_blocks, `+` to opt out, one trailing newline dropped, \r\n and \r read as
// \n), dropping comments and passing `{% raw %}` bodies through as text. Internal to
// engine/chat. Thread-safe (pure function).
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace pd::chat::internal {

enum class TokenType {
  kText,        // literal template text (value: the text)
  kVarBegin,    // {{
  kVarEnd,      // }}
  kBlockBegin,  // {%
  kBlockEnd,    // %}
  kName,        // identifier or keyword
  kString,      // string literal (value: decoded)
  kInt,         // integer literal (value: its digits, underscores removed, base prefix kept)
  kFloat,       // float literal (value: its text, underscores removed)
  kOperator,    // + - * / // % ** ~ == != < <= > >= = ( ) [ ] { } , . : | ;
  kEnd,         // end of template
};

struct Token {
  TokenType type = TokenType::kEnd;
  std::string value;
  int line = 1;
  int column = 1;
};

struct LexOptions {
  bool trim_blocks = false;
  bool lstrip_blocks = false;
};

// The template's tokens, ending with kEnd. InvalidArgument ("line L, column C: ...") for an
// unterminated tag, comment, raw block or string, an unknown character, a bad escape or
// unbalanced brackets.
absl::StatusOr<std::vector<Token>> Lex(absl::string_view source, const LexOptions& options);

}  // namespace pd::chat::internal
