#include "engine/chat/jinja.h"

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "engine/chat/ast.h"
#include "engine/chat/interpreter.h"
#include "engine/chat/lexer.h"
#include "engine/chat/parser.h"

namespace pd::chat {

absl::Status RenderLimits::Validate() const {
  const std::pair<const char*, int64_t> limits[] = {
      {"max_output_bytes", max_output_bytes}, {"max_work", max_work},
      {"max_iterations", max_iterations},     {"max_memory_bytes", max_memory_bytes},
      {"max_call_depth", max_call_depth},     {"max_items", max_items}};
  for (const auto& [name, value] : limits) {
    if (value <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("template render limit ", name, " must be positive, got ", value));
    }
  }
  if (max_duration <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("template render limit max_duration must be positive, got ",
                     absl::FormatDuration(max_duration)));
  }
  return absl::OkStatus();
}

absl::StatusOr<Template> Template::Parse(absl::string_view source, const TemplateOptions& options) {
  internal::LexOptions lex;
  lex.trim_blocks = options.trim_blocks;
  lex.lstrip_blocks = options.lstrip_blocks;
  PD_ASSIGN_OR_RETURN(std::vector<internal::Token> tokens, internal::Lex(source, lex));
  PD_ASSIGN_OR_RETURN(internal::StmtList body,
                      internal::Parse(std::move(tokens), options.max_nesting_depth));
  return Template(std::make_shared<const internal::StmtList>(std::move(body)));
}

absl::StatusOr<std::string> Template::Render(const Value& context,
                                             const RenderLimits& limits) const {
  return internal::RenderTree(*body_, context, limits);
}

}  // namespace pd::chat
