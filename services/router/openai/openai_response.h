// OpenAI-compatible response bodies: errors, the non-streaming completion / chat completion
// objects, and the server-sent-event chunks of a stream, built from the router's
// pdserve.v1.GenerateResponse messages.
//
// ResponseBuilder is fed the relayed messages of one request in order; it accumulates what a
// non-streaming response needs and renders each message as the chunks a stream sends.
// Thread-compatible (one request, one thread at a time).
#pragma once

#include <cstdint>
#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "pd/v1/generation.pb.h"
#include "services/router/openai/openai_request.h"
#include "services/router/openai/reasoning_parser.h"
#include "services/router/openai/tool_parser.h"

namespace pd::router::openai {

// An error as OpenAI clients expect it: HTTP status + {"error": {message, type, param, code}}.
struct ApiError {
  int http_status = 500;
  std::string message;
  std::string type;   // invalid_request_error, authentication_error, ...
  std::string param;  // "" = null
  std::string code;   // "" = null
};

// Maps a status (from parsing, the router's admission and placement, or a worker) to the HTTP
// error: InvalidArgument/OutOfRange/FailedPrecondition 400, Unauthenticated 401,
// PermissionDenied 403, NotFound 404, ResourceExhausted 429, Unavailable 503,
// DeadlineExceeded 504, Unimplemented 501, anything else 500.
ApiError ErrorFromStatus(const absl::Status& status);
// {"error": {...}} as a JSON document.
std::string ErrorBody(const ApiError& error);

// "stop" / "length" for the finish reasons that end a request normally.
absl::string_view FinishReasonName(pdserve::v1::FinishReason reason);

// The bytes of token `token` when it follows `prev` (engine::Tokenizer::DecodeToken; prev may
// be kNoPrevToken); any bytes, not necessarily whole UTF-8 characters. Used to name the tokens
// of logprobs. An id the tokenizer refuses should give "".
using TokenBytesFn = std::function<std::string(uint32_t prev, uint32_t token)>;
inline constexpr uint32_t kNoPrevToken = std::numeric_limits<uint32_t>::max();

// A logprob as JSON carries it: -inf (a token of probability 0) becomes -9999.0, as vLLM
// reports it, since JSON has no infinity; NaN (the model produced NaN logits) stays NaN and is
// written as null.
double JsonLogprob(float logprob);

class ResponseBuilder {
 public:
  // `id` is the response id ("cmpl-..." / "chatcmpl-..."); `created` in Unix seconds;
  // `echo_text` precedes the completion's text (completions with echo). `token_bytes` names
  // the tokens of logprobs; needed only when the request asked for them (request.logprobs
  // >= 0), whose messages then carry GenerateResponse.logprobs:
  //  - chat: choice.logprobs = {"content": [{token, logprob, bytes, top_logprobs: [{token,
  //    logprob, bytes}]}], "refusal": null}, top_logprobs holding request.logprobs entries;
  //  - completions: choice.logprobs = {tokens, token_logprobs, top_logprobs, text_offset},
  //    each top_logprobs entry a {token: logprob} object of the request.logprobs alternatives
  //    plus the sampled token (as vLLM and the legacy OpenAI API do), text_offset the token's
  //    start in the choice's text in characters (code points), echoed prompt included.
  // A streamed chunk carries the entries of the tokens that arrived with it, so a chunk may
  // have logprobs and no text (bytes held back until a character completes).
  //
  // Tool calls (chat with request.tools offered; tool_parser.h): an enforced tool choice reads
  // the output as the call; "auto" (without another constraint) parses it in `tool_format`.
  // Calls become message.tool_calls [{id, type "function", function {name, arguments}}] with
  // content null when no text came before them, and the finish reason "tool_calls" when the
  // output ended normally. A stream sends them as delta.tool_calls, as OpenAI does: a call's
  // first chunk carries index, id, type, function.name and function.arguments "", later chunks
  // index and the next piece of function.arguments.
  //
  // Reasoning (chat; reasoning_parser.h): with `reasoning` set (the model's template writes
  // reasoning blocks; the value says whether the prompt opened one), the block's text becomes
  // message.reasoning_content (null when there was none; streamed as delta.reasoning_content)
  // and the rest is the content, where tool calls are parsed. Under a response format or an
  // enforced call too: pd-router's grammar then lets the block come first and constrains the
  // answer after it (HttpRoutes::ConstrainAfterReasoning).
  ResponseBuilder(const OpenAiRequest& request, std::string id, int64_t created, std::string model,
                  std::string echo_text, TokenBytesFn token_bytes = nullptr,
                  ToolCallFormat tool_format = ToolCallFormat::kHermes,
                  std::optional<bool> reasoning = std::nullopt);

  // Stream: the chunks ("data: {...}\n\n" events) that relay `msg`, in order. The first call
  // also emits the chat stream's role chunk (or the echoed prompt); the message carrying the
  // finish reason adds the final chunk (and the usage chunk when asked).
  std::string StreamEvents(const pdserve::v1::GenerateResponse& msg);
  // Stream end: "data: [DONE]\n\n".
  static std::string DoneEvent();
  // An error in the middle of a stream: one event with the error object.
  static std::string ErrorEvent(const ApiError& error);

  // Non-streaming: accumulates `msg`.
  void Add(const pdserve::v1::GenerateResponse& msg);
  // Non-streaming: the whole response object, once the final message was added.
  std::string Body() const;

  // n > 1 (one builder per choice, each fed its own sibling's messages):
  // The choice's index in "choices" (default 0), in every chunk and in ChoiceJson.
  void set_choice_index(int index) { choice_index_ = index; }
  // Whether StreamEvents ends the choice with the usage chunk (when the request asked for it);
  // siblings do not: the request's usage chunk comes once, after every choice ended
  // (UsageEvent with their CombinedUsage).
  void set_usage_chunk(bool on) { usage_chunk_ = on; }
  bool include_usage() const { return include_usage_; }
  // Non-streaming: this choice as JSON, once its final message was added.
  std::string ChoiceJson() const;
  // The usage of the final message (prompt counted once per choice).
  const pdserve::v1::Usage& usage() const { return usage_; }
  // The response object with `choices` (ChoiceJson of each) and `usage`.
  std::string BodyOf(const std::vector<std::string>& choices,
                     const pdserve::v1::Usage& usage) const;
  // The stream's usage chunk ("choices": [] and `usage`).
  std::string UsageEvent(const pdserve::v1::Usage& usage) const;
  // The usage of n choices of one prompt: the prompt (and its cached tokens) once, completion
  // tokens summed.
  static pdserve::v1::Usage CombinedUsage(const std::vector<pdserve::v1::Usage>& choices);

  bool finished() const { return finish_reason_ != pdserve::v1::FINISH_REASON_UNSPECIFIED; }

 private:
  std::string Chunk(const std::string& choice_json, bool with_usage_null) const;
  static std::string UsageJson(const pdserve::v1::Usage& usage);
  bool wants_logprobs() const { return logprobs_ >= 0; }
  // Non-streaming: takes the parser's events into text_ and calls_.
  void Collect(std::vector<ToolCallEvent> events);
  // The text of a message split by the reasoning parser (when on): reasoning and content.
  void SplitReasoning(const std::string& text, bool last, std::string* reasoning,
                      std::string* content);
  // The choice's finish_reason: "tool_calls" when calls were made and the output ended normally.
  std::string FinishReason() const;

  struct Call {
    std::string id;
    std::string name;
    std::string arguments;
  };

  const Endpoint endpoint_;
  const bool include_usage_;
  const std::string id_;
  const int64_t created_;
  const std::string model_;
  std::string echo_text_;
  const int32_t logprobs_;
  const TokenBytesFn token_bytes_;
  int choice_index_ = 0;
  bool usage_chunk_ = true;
  uint32_t prev_token_ = kNoPrevToken;
  int64_t text_offset_ = 0;  // code points before the next token (completions)
  // Non-streaming: every generated token and its entry, rendered by Body().
  google::protobuf::RepeatedField<uint32_t> tokens_;
  google::protobuf::RepeatedPtrField<pdserve::v1::TokenLogprob> token_logprobs_;
  bool started_ = false;
  std::string text_;
  pdserve::v1::FinishReason finish_reason_ = pdserve::v1::FINISH_REASON_UNSPECIFIED;
  pdserve::v1::Usage usage_;
  // Tool calls: the output's parser (none when no tools are offered or a response format
  // constrains the output), and the calls made (non-streaming).
  std::optional<ToolCallParser> tools_;
  // Reasoning blocks: the parser (chat, when on) and the reasoning text (non-streaming).
  std::optional<ReasoningParser> reasoning_;
  std::string reasoning_text_;
  std::vector<Call> calls_;
  // The legacy functions API: the first call is answered as `function_call` (the API has one
  // at most), finish_reason "function_call".
  bool legacy_functions_ = false;
};

}  // namespace pd::router::openai
