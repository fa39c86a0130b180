// OpenAI-compatible response bodies: errors, the non-streaming completion / chat completion
// objects, and the server-sent-event chunks of a stream, built from the router's
// pdserve.v1.GenerateResponse messages.
//
// ResponseBuilder is fed the relayed messages of one request in order; it accumulates what a
// non-streaming response needs and renders each message as the chunks a stream sends.
// Thread-compatible (one request, one thread at a time).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "pd/v1/generation.pb.h"
#include "services/router/openai/openai_request.h"

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

class ResponseBuilder {
 public:
  // `id` is the response id ("cmpl-..." / "chatcmpl-..."); `created` in Unix seconds;
  // `echo_text` precedes the completion's text (completions with echo).
  ResponseBuilder(const OpenAiRequest& request, std::string id, int64_t created, std::string model,
                  std::string echo_text);

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

  bool finished() const { return finish_reason_ != pdserve::v1::FINISH_REASON_UNSPECIFIED; }

 private:
  std::string Chunk(const std::string& choice_json, bool with_usage_null) const;
  std::string UsageJson() const;

  const Endpoint endpoint_;
  const bool include_usage_;
  const std::string id_;
  const int64_t created_;
  const std::string model_;
  std::string echo_text_;
  bool started_ = false;
  std::string text_;
  pdserve::v1::FinishReason finish_reason_ = pdserve::v1::FINISH_REASON_UNSPECIFIED;
  pdserve::v1::Usage usage_;
};

}  // namespace pd::router::openai
