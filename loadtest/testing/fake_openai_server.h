// FakeOpenAiServer: a minimal OpenAI-compatible HTTP server (cpp-httplib on 127.0.0.1) that
// streams scripted chunks with controlled timing, for the tests of pd-loadtest's OpenAI
// backend, as FakeGenerationServer is for its gRPC one.
//
//   GET  /v1/models             {"object": "list", "data": [{"id": model_id, ...}]}
//   POST /v1/completions        prompt must be a token-id array
//   POST /v1/chat/completions   messages: [{"role": "user", "content": TEXT}]
//
// A POST must be valid JSON with the configured model, stream: true and
// stream_options.include_usage: true, else 400 with an OpenAI error object. It then streams
// (text/event-stream, chunked): for chat a role-only first chunk (no content), then max_tokens
// tokens in chunks of tokens_per_chunk ("t " per token), waiting first_token_delay before the
// first and token_delay before every later chunk; the last content chunk carries
// finish_reason "length", then a usage chunk (choices: []) and `data: [DONE]`. Comment lines
// (": ping") and CRLF line ends can be mixed in. Usage: prompt_tokens = the prompt's ids
// (completions) or bytes of the message (chat), cached_tokens as configured.
//
// Thread-safety: thread-safe; handlers run on the server's threads.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace pd::loadtest::testing {

struct FakeOpenAiServerOptions {
  std::string model_id = "fake-model";
  int64_t max_model_len = 4096;  // reported by /v1/models; 0 = omitted
  std::string api_key;           // required as "Authorization: Bearer <key>"; "" = none
  int tokens_per_chunk = 1;      // >= 1
  absl::Duration first_token_delay = absl::ZeroDuration();
  absl::Duration token_delay = absl::ZeroDuration();  // before each later chunk
  int64_t cached_tokens = 0;  // reported in usage.prompt_tokens_details (capped at the prompt)
  bool crlf = false;          // end lines with CRLF instead of LF
  bool comments = false;      // send ": ping" comment lines between events
  // Requests number n, 2n, ... (1-based) fail: with fail_http_status and an error object, or,
  // with fail_mode "malformed", a 200 stream whose second event is not JSON, or, with
  // "stream_error", a 200 stream whose second event is {"error": {...}} (code 500).
  int64_t fail_every_n = 0;
  int fail_http_status = 429;
  std::string fail_mode = "http";  // http | malformed | stream_error
};

struct FakeOpenAiServerStats {
  int64_t requests = 0;   // POSTs received
  int64_t completed = 0;  // streams sent to their end
  int64_t aborted = 0;    // streams whose client went away before the end
  int64_t active_streams = 0;
  int64_t max_active_streams = 0;
  std::string last_body;  // the last POST body
};

class FakeOpenAiServer {
 public:
  // Binds 127.0.0.1:0 and serves on its own threads. Unavailable when it cannot bind.
  static absl::StatusOr<std::unique_ptr<FakeOpenAiServer>> Start(FakeOpenAiServerOptions options);
  ~FakeOpenAiServer();  // Shutdown()

  int port() const;
  std::string url() const;  // "http://127.0.0.1:<port>"
  FakeOpenAiServerStats stats() const;
  // Blocks until at least `n` streams are open at once (stats().active_streams >= n); false
  // when `timeout` passes first, so a test fails instead of hanging.
  bool WaitForActiveStreams(int64_t n, absl::Duration timeout) const;
  // Ends open streams (their waits return at once) and stops the server. Idempotent.
  void Shutdown();

  class Impl;

 private:
  explicit FakeOpenAiServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace pd::loadtest::testing
