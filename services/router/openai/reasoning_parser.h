// Reasoning blocks in chat output (issue #34): models such as Qwen3, QwQ and DeepSeek-R1 think
// in a block "<think> ... </think>" before they answer. The OpenAI API (as vLLM's reasoning
// parsers serve it) returns the block's text as message.reasoning_content (streamed as
// delta.reasoning_content) and only the answer as content.
//
// Rules (docs/openai-api.md, "Reasoning"):
//  - The output is reasoning from its start when it begins with "<think>" (whitespace before it
//    allowed), or when the prompt's generation prompt opened the block itself (DeepSeek-R1's
//    and Qwen3-Thinking's templates end the prompt with "<think>\n"). Otherwise it is all
//    content (a Qwen3 prompt rendered with enable_thinking=false closes an empty block).
//  - Reasoning ends at the first "</think>"; the newlines right after it are dropped and the
//    rest is content (tool calls included, parsed as before).
//  - A block that never ends (max_tokens) is all reasoning; content is then null.
// Streamed and whole outputs give the same split, however the text is cut into pieces.
#pragma once

#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace pd::router::openai {

inline constexpr absl::string_view kThinkStart = "<think>";
inline constexpr absl::string_view kThinkEnd = "</think>";

// Whether a chat template writes reasoning blocks (mentions "</think>").
bool TemplateHasThinkBlocks(absl::string_view template_source);
// Whether a rendered prompt leaves a reasoning block open for the output: its last "<think>"
// comes after its last "</think>" and only whitespace follows it.
bool PromptOpensThinkBlock(absl::string_view prompt);

struct ReasoningEvent {
  enum class Kind { kReasoning, kContent };
  Kind kind;
  std::string text;
};

// Splits one output, fed in pieces, into reasoning and content. Thread-compatible.
class ReasoningParser {
 public:
  // `starts_open`: the prompt opened the block (PromptOpensThinkBlock).
  explicit ReasoningParser(bool starts_open);

  // The events the text so far allows (text that may still be part of a tag is held).
  std::vector<ReasoningEvent> Feed(absl::string_view text);
  // The output ended: what was held.
  std::vector<ReasoningEvent> Finish();

  // Whether the output had a reasoning block (maybe empty): reasoning_content is then a string,
  // else null.
  bool in_block() const { return in_block_; }

 private:
  enum class State { kStart, kReasoning, kAfterEnd, kContent };
  void Emit(ReasoningEvent::Kind kind, absl::string_view text, std::vector<ReasoningEvent>* out);

  State state_;
  std::string held_;
  bool in_block_ = false;
};

}  // namespace pd::router::openai
