// OpenAI-compatible request bodies (POST /v1/completions, POST /v1/chat/completions) parsed and
// checked into the router's terms. Every field the OpenAI API defines is either honoured or
// refused with InvalidArgument naming it; unknown fields are refused too, so a client never
// believes a setting took effect when it did not (docs/openai.md lists them).
//
// Errors carry the offending field in a status payload (ParamOf), which the HTTP front turns
// into the error object's "param".
//
// Pure functions; thread-safe.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "pd/v1/generation.pb.h"
#include "services/router/openai/tool_request.h"

namespace pd::router::openai {

enum class Endpoint { kCompletions, kChat };

// "completions" / "chat.completions" (metrics labels, logs).
absl::string_view EndpointName(Endpoint endpoint);

// One chat message with its content flattened to text (text parts concatenated in order).
// Roles: "system" (also for OpenAI's "developer"), "user", "assistant", "tool".
struct ChatMessage {
  std::string role;
  std::string content;
  // An assistant message whose content was null or absent (it carries tool calls): the chat
  // template sees `content` as "", as vLLM passes it (Qwen3's template fails on None), or
  // None where the template tests `content is none` (DeepSeek's).
  bool content_null = false;
  // Assistant: its tool calls (ParseHistoryToolCalls: a JSON array as text); "" for none.
  std::string tool_calls_json;
  // ... and each call's arguments as the client wrote them (templates that write arguments
  // as a string get these: engine/chat/chat_template.h).
  std::vector<std::string> tool_call_arguments;
  // Tool: the call this message answers. "" when not given.
  std::string tool_call_id;
  // The optional `name` of the message ("" when absent).
  std::string name;
};

struct ParseLimits {
  uint32_t max_tokens_limit = 131072;  // max_tokens / max_completion_tokens upper bound
  uint32_t max_stop_strings = 16;
  uint32_t max_messages = 4096;
  uint32_t max_prompt_tokens = 131072;  // token-id prompts
  uint32_t max_top_logprobs = 20;
  // Arrays and objects nested deeper than this refuse the whole body (the deepest valid
  // request, a chat message's content part, is 5 levels).
  uint32_t max_json_depth = 64;
  uint32_t max_logit_bias = 300;  // logit_bias entries (OpenAI's limit)
  // Choices per request (`n`): each is a stream of its own (one slot of --max_inflight and of
  // the tenant's --max_streams_per_tenant), so the bound keeps one request from taking them all.
  uint32_t max_n = 16;
  // The model's vocabulary: logit_bias ids must be below it. 0 = not checked here (the router
  // checks again before placing the request).
  uint32_t vocab_size = 0;
};

// A request as the router runs it.
struct OpenAiRequest {
  Endpoint endpoint = Endpoint::kCompletions;
  std::string model;
  // kCompletions: exactly one of text / token ids (an array of integers).
  std::optional<std::string> prompt_text;
  std::optional<std::vector<uint32_t>> prompt_ids;
  // kChat: at least one message.
  std::vector<ChatMessage> messages;
  bool add_generation_prompt = true;  // kChat (extension, as vLLM accepts it)
  // kChat (extension, as vLLM accepts it): more variables for the chat template, e.g.
  // {"enable_thinking": false} for Qwen3; a JSON object's text, "" = none. Its keys may not be
  // the template's own inputs (messages, tools, add_generation_prompt).
  std::string chat_template_kwargs;
  // max_tokens (0 = until the context is full), temperature, top_p, top_k, min_p, seed, stop,
  // stop_token_ids, min_tokens, ignore_eos, presence_penalty, frequency_penalty,
  // repetition_penalty, logit_bias. OpenAI's defaults apply: temperature 1, top_p 1,
  // max_tokens 16 for completions and unbounded for chat.
  pdserve::v1::SamplingParams sampling;
  std::optional<std::string> cache_salt;  // extension
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  bool echo = false;           // kCompletions: the prompt's text precedes the completion
  // Logprobs of the generated tokens: -1 = not asked; else how many alternatives per token
  // (completions: `logprobs: N`; chat: `logprobs: true` with `top_logprobs: N`).
  int32_t logprobs = -1;
  // `n`: how many choices (1 to ParseLimits::max_n). Siblings share the prompt's KV blocks:
  // the first is placed and prefilled as any request, the others run on its decode worker
  // (docs/openai.md, "n > 1"). `best_of`, when sent, must equal n.
  int32_t n = 1;
  // kChat: `tools`, `tool_choice`, `parallel_tool_calls`. An enforced choice has set
  // sampling.constraint to EnforcedCallSchema.
  ToolsSpec tools;
};

// Parses and checks `body` (a JSON object). InvalidArgument naming the field for malformed JSON,
// wrong types, out-of-range values (a logit_bias key that is not a token id of the vocabulary
// names the key), unknown fields, and fields this server cannot honour (best_of other than n,
// echo with logprobs, suffix, tools on /v1/completions, an enforced tool_choice with another
// constraint, non-text content parts).
absl::StatusOr<OpenAiRequest> ParseRequest(Endpoint endpoint, absl::string_view body,
                                           const ParseLimits& limits);

// The deepest nesting of arrays and objects in JSON `text` (strings skipped), the scan stopped
// once it exceeds `stop_at`; `field` is then the top-level key under which it did (first 64
// bytes; "" outside any). Assumes nothing of validity: a bound checked before parsing.
struct JsonDepth {
  size_t depth = 0;
  std::string field;
};
JsonDepth JsonNestingDepth(absl::string_view text, size_t stop_at);

// The request field an error names ("" when none): set by ParseRequest's errors.
std::string ParamOf(const absl::Status& status);
// `status` with `param` attached (see ParamOf).
absl::Status WithParam(absl::Status status, absl::string_view param);

}  // namespace pd::router::openai
