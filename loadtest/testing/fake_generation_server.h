// FakeGenerationServer: a minimal pdserve.v1.Generation server that streams canned tokens, for
// pd-loadtest's tests and its throughput benchmark (real gRPC, 127.0.0.1).
//
// Generate validates the prompt (non-empty token ids, each < vocab_size), then streams
// max_tokens tokens (default_output_tokens when max_tokens is 0) in messages of
// tokens_per_message tokens, optionally waiting first_token_delay before the first and
// token_delay before every later message; the last message carries finish reason LENGTH,
// usage (prompt, cached, completion tokens) and the request id. ListModels reports one model.
// Options inject failures (every n-th request fails with a chosen code before any token) and a
// simple prefix cache (cached_tokens = leading full blocks seen in earlier prompts).
//
// Implemented on gRPC's completion-queue async API (num_threads polling threads), which costs
// less CPU per streamed message than the callback API: the benchmark runs it beside the load
// generator on the same cores.
//
// Thread-safety: thread-safe; handlers run on the server's polling threads.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace pd::loadtest::testing {

struct FakeGenerationServerOptions {
  std::string address = "127.0.0.1:0";  // port 0 = pick a free port
  std::string model_id = "fake-model";
  uint32_t vocab_size = 32000;
  uint32_t block_size = 16;
  uint32_t max_context_tokens = 1 << 20;
  int64_t default_output_tokens = 16;  // when the request's max_tokens is 0
  int tokens_per_message = 1;          // >= 1
  absl::Duration first_token_delay = absl::ZeroDuration();
  absl::Duration token_delay = absl::ZeroDuration();  // before each later message
  // Requests number n, 2n, 3n, ... (1-based arrival order) fail with fail_code before any
  // token. 0 = never.
  int64_t fail_every_n = 0;
  absl::StatusCode fail_code = absl::StatusCode::kUnavailable;
  bool simulate_prefix_cache = false;
  int num_threads = 2;  // completion-queue polling threads, [1, 64]

  absl::Status Validate() const;
};

// Counters since start.
struct FakeGenerationServerStats {
  int64_t requests = 0;   // Generate calls received
  int64_t succeeded = 0;  // streams finished OK
  int64_t failed = 0;     // rejected or injected failures
  int64_t cancelled = 0;  // ended by the client (cancel, deadline)
  int64_t tokens_sent = 0;
  // Streams accepted whose final status (or last message) has not been issued yet. This
  // interval lies inside the client's view of the request (sent -> status received), so
  // max_active_streams never exceeds the client's most requests in flight.
  int64_t active_streams = 0;
  int64_t max_active_streams = 0;
};

class FakeGenerationServer {
 public:
  // Errors: InvalidArgument for bad options, Unavailable when the address cannot be bound.
  static absl::StatusOr<std::unique_ptr<FakeGenerationServer>> Start(
      const FakeGenerationServerOptions& options);
  // Shutdown() then frees the server.
  ~FakeGenerationServer();

  int port() const { return port_; }
  std::string address() const;  // "127.0.0.1:<port>"
  FakeGenerationServerStats stats() const;
  // Blocks until at least `n` streams are open at once (stats().active_streams >= n); false
  // when `timeout` passes first, so a test fails instead of hanging.
  bool WaitForActiveStreams(int64_t n, absl::Duration timeout) const;

  // Cancels open streams and stops the server. Idempotent.
  void Shutdown();

  class Impl;  // the async service, queues and counters (public for the .cc's call classes)

 private:
  FakeGenerationServer();

  int port_ = 0;
  std::unique_ptr<Impl> impl_;
  std::atomic<bool> shut_down_{false};
};

}  // namespace pd::loadtest::testing
