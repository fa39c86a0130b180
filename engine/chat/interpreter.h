// The tree-walking evaluator of the Jinja2 subset (engine/chat/jinja.h). Internal to
// engine/chat. Thread-safe (each call has its own state; the tree is only read).
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "engine/chat/ast.h"
#include "engine/chat/jinja.h"
#include "engine/chat/value.h"

namespace pd::chat::internal {

// Renders `body` with the variables of `context` (a dict) within `limits`.
absl::StatusOr<std::string> RenderTree(const StmtList& body, const Value& context,
                                       const RenderLimits& limits);

}  // namespace pd::chat::internal
