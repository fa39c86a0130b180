#include "services/router/openai/reasoning_parser.h"

#include <algorithm>

#include "absl/strings/match.h"

namespace pd::router::openai {
namespace {

constexpr char kSpace[] = " \t\r\n";

// The length of the longest suffix of `text` that is a proper prefix of `tag`.
size_t PartialTagSuffix(absl::string_view text, absl::string_view tag) {
  for (size_t k = std::min(text.size(), tag.size() - 1); k > 0; --k) {
    if (absl::EndsWith(text, tag.substr(0, k))) return k;
  }
  return 0;
}

}  // namespace

bool TemplateHasThinkBlocks(absl::string_view template_source) {
  return absl::StrContains(template_source, kThinkEnd);
}

bool PromptOpensThinkBlock(absl::string_view prompt) {
  const size_t end = prompt.find_last_not_of(kSpace);
  if (end == absl::string_view::npos) return false;
  return absl::EndsWith(prompt.substr(0, end + 1), kThinkStart);
}

ReasoningParser::ReasoningParser(bool starts_open)
    : state_(starts_open ? State::kReasoning : State::kStart), in_block_(starts_open) {}

void ReasoningParser::Emit(ReasoningEvent::Kind kind, absl::string_view text,
                           std::vector<ReasoningEvent>* out) {
  if (text.empty()) return;
  if (!out->empty() && out->back().kind == kind) {
    out->back().text.append(text.data(), text.size());
  } else {
    out->push_back({kind, std::string(text)});
  }
}

std::vector<ReasoningEvent> ReasoningParser::Feed(absl::string_view text) {
  std::vector<ReasoningEvent> out;
  held_.append(text.data(), text.size());
  while (true) {
    switch (state_) {
      case State::kStart: {
        const size_t first = held_.find_first_not_of(kSpace);
        if (first == std::string::npos) return out;  // only whitespace so far
        const absl::string_view rest = absl::string_view(held_).substr(first);
        if (absl::StartsWith(rest, kThinkStart)) {
          held_ = std::string(rest.substr(kThinkStart.size()));
          state_ = State::kReasoning;
          in_block_ = true;
          continue;
        }
        if (absl::StartsWith(kThinkStart, rest)) return out;  // maybe the tag, in pieces
        state_ = State::kContent;  // no block: all content, the whitespace too
        continue;
      }
      case State::kReasoning: {
        const size_t end = absl::string_view(held_).find(kThinkEnd);
        if (end != std::string::npos) {
          Emit(ReasoningEvent::Kind::kReasoning, absl::string_view(held_).substr(0, end), &out);
          held_.erase(0, end + kThinkEnd.size());
          state_ = State::kAfterEnd;
          continue;
        }
        const size_t keep = PartialTagSuffix(held_, kThinkEnd);
        Emit(ReasoningEvent::Kind::kReasoning,
             absl::string_view(held_).substr(0, held_.size() - keep), &out);
        held_.erase(0, held_.size() - keep);
        return out;
      }
      case State::kAfterEnd: {
        const size_t first = held_.find_first_not_of("\r\n");
        if (first == std::string::npos) {
          held_.clear();  // the newlines after the block are dropped
          return out;
        }
        held_.erase(0, first);
        state_ = State::kContent;
        continue;
      }
      case State::kContent:
        Emit(ReasoningEvent::Kind::kContent, held_, &out);
        held_.clear();
        return out;
    }
  }
}

std::vector<ReasoningEvent> ReasoningParser::Finish() {
  std::vector<ReasoningEvent> out;
  switch (state_) {
    case State::kStart:  // whitespace, or the start of a tag that never completed
    case State::kContent:
      Emit(ReasoningEvent::Kind::kContent, held_, &out);
      break;
    case State::kReasoning:  // a block that never ended: a partial "</think>" is its text
      Emit(ReasoningEvent::Kind::kReasoning, held_, &out);
      break;
    case State::kAfterEnd:
      break;
  }
  held_.clear();
  return out;
}

}  // namespace pd::router::openai
