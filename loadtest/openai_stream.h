// The OpenAI HTTP API as pd-loadtest speaks it, without any I/O: request bodies, the
// server-sent-events (SSE) stream of a streaming response, its translation into a
// RequestRecord, error bodies and the model list. openai_client.h does the HTTP.
//
// Record semantics (docs/loadtest.md):
//   TTFT    the first chunk carrying content (choices[0].text for completions,
//           choices[0].delta.content or .reasoning_content for chat) that is not empty; the
//           role-only first chunk of a chat stream does not count.
//   ITL     one sample per later content chunk: the gap since the previous content chunk (a
//           server sending k tokens in one chunk gives one sample, not k).
//   tokens  output_tokens = usage.completion_tokens of the final usage chunk (requested with
//           stream_options.include_usage); without usage, the number of content chunks.
//           prompt_tokens and cached_tokens (usage.prompt_tokens_details.cached_tokens) from
//           the same chunk.
//   errors  an HTTP status other than 200 maps to a canonical code (HttpStatusToCode) with the
//           error object's message; an `{"error": ...}` payload in the stream likewise; a
//           payload that is not JSON is INTERNAL; a stream ending without a finish reason is
//           INTERNAL, as with gRPC.
// Pure functions and thread-compatible classes.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "loadtest/sampling_penalties.h"
#include "loadtest/metrics.h"

namespace pd::loadtest {

enum class OpenAiEndpoint {
  kCompletions,  // POST /v1/completions, prompt = token ids
  kChat,         // POST /v1/chat/completions, one user message of text
};

// "completions" or "chat"; InvalidArgument otherwise (naming `flag`).
absl::StatusOr<OpenAiEndpoint> ParseOpenAiEndpoint(absl::string_view flag, absl::string_view text);
absl::string_view OpenAiEndpointName(OpenAiEndpoint endpoint);  // "completions" / "chat"
// The path below the API root: "/completions" or "/chat/completions".
absl::string_view OpenAiEndpointPath(OpenAiEndpoint endpoint);

// A target URL split for httplib: "http://127.0.0.1:8000/v1" -> origin "http://127.0.0.1:8000",
// api_root "/v1".
struct OpenAiUrl {
  std::string origin;    // scheme://host:port
  std::string api_root;  // path of the API, ending in /v1 (no trailing slash)
};

// Accepts http:// or https:// URLs with an optional path: "" or "/" means "/v1"; a path that
// does not end in "/v1" gets "/v1" appended ("http://h:8000/openai" -> "/openai/v1").
// InvalidArgument (naming `flag`) for anything else, e.g. a bare host:port.
absl::StatusOr<OpenAiUrl> ParseOpenAiUrl(absl::string_view flag, absl::string_view url);

// What one request asks for.
struct OpenAiRequestFields {
  OpenAiEndpoint endpoint = OpenAiEndpoint::kCompletions;
  std::string model;
  absl::Span<const uint32_t> prompt_ids;  // completions: sent as a token-id array
  absl::string_view prompt_text;          // chat: the user message (invalid UTF-8 replaced)
  int64_t max_tokens = 0;
  double temperature = 0;
  SamplingPenalties penalties;  // each sent only when not zero
  bool ignore_eos = true;  // sent as the ignore_eos extension (vLLM, SGLang) only when true
  std::string cache_salt;  // sent as cache_salt (vLLM's extension) only when not empty
  // Sent as response_format {type: json_schema, json_schema: {name, schema}} when not empty
  // (JSON text; must parse).
  std::string json_schema;
};

// The JSON body: model, prompt or messages, max_tokens, temperature, stream: true,
// stream_options: {include_usage: true}, plus ignore_eos / cache_salt as above.
std::string OpenAiRequestBody(const OpenAiRequestFields& fields);

// Incremental decoder of a text/event-stream body (the WHATWG server-sent events format):
// lines end with LF, CRLF or CR, split anywhere across Feed calls; "data:" fields of one event
// are joined with "\n"; comments (":...") and other fields are ignored; a blank line ends an
// event. Thread-compatible.
class SseDecoder {
 public:
  // Decodes `bytes`, calling `on_data` with the data of every event completed by them.
  // Returns false as soon as `on_data` does (the rest of `bytes` is dropped).
  bool Feed(absl::string_view bytes, absl::FunctionRef<bool(absl::string_view data)> on_data);

 private:
  bool EndLine(absl::FunctionRef<bool(absl::string_view)> on_data);

  std::string line_;
  std::string data_;
  bool has_data_ = false;
  bool after_cr_ = false;  // the last byte was CR: a following LF belongs to the same line end
};

// Folds the events of one streaming response into `record` (which must outlive it): see the
// file comment. Thread-compatible.
class OpenAiStreamRecorder {
 public:
  OpenAiStreamRecorder(OpenAiEndpoint endpoint, RequestRecord* record);

  // One event's data that arrived at `now_ns`. Returns false when the stream must not be read
  // further ([DONE], an error payload, malformed JSON).
  bool OnData(absl::string_view data, int64_t now_ns);
  // Content chunks seen so far.
  int64_t content_chunks() const { return content_chunks_; }
  bool done() const { return done_; }

  // Completes the record at `end_ns` after the stream ended with `transport` (OK when the body
  // was read to its end or OnData stopped it; otherwise the failure that ended it, which
  // wins over an incomplete stream but not over an error payload).
  void Finish(int64_t end_ns, const absl::Status& transport);

 private:
  void Fail(absl::StatusCode code, std::string message);

  const OpenAiEndpoint endpoint_;
  RequestRecord* const record_;
  int64_t last_content_ns_ = -1;
  int64_t content_chunks_ = 0;
  bool done_ = false;
  bool failed_ = false;
};

// The canonical code of an HTTP status: 400 INVALID_ARGUMENT, 401 UNAUTHENTICATED, 403
// PERMISSION_DENIED, 404 NOT_FOUND, 408 and 504 DEADLINE_EXCEEDED, 409 ABORTED, 413
// INVALID_ARGUMENT, 429 RESOURCE_EXHAUSTED, 499 CANCELLED, 501 UNIMPLEMENTED, 502 and 503
// UNAVAILABLE, other 4xx FAILED_PRECONDITION, other 5xx INTERNAL, anything else UNKNOWN.
absl::StatusCode HttpStatusToCode(int http_status);

// The status of a failed response: HttpStatusToCode(http_status) with "HTTP <status>: <the
// error object's message>" (OpenAI's {"error": {"message": ...}} or a top-level "message"),
// or the start of the body when it holds none.
absl::Status HttpErrorStatus(int http_status, absl::string_view body);

// One entry of GET /v1/models.
struct OpenAiModel {
  std::string id;
  int64_t max_model_len = 0;  // vLLM's extension field; 0 when absent
};

// Parses a /v1/models response ({"object": "list", "data": [{"id": ...}, ...]}).
// InvalidArgument when it is not such an object.
absl::StatusOr<std::vector<OpenAiModel>> ParseModelList(absl::string_view body);

}  // namespace pd::loadtest
