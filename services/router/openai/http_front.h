// HttpFront: pd-router's OpenAI-compatible HTTP API, beside the gRPC one (docs/openai.md).
//
//   GET  /health                200 while a decode worker is up and the router is not draining
//   GET  /v1/models             the served model (with --api_keys_file: needs a key)
//   GET  /v1/models/{id}
//   POST /v1/completions        prompt as text or token ids; stream or one JSON object
//   POST /v1/chat/completions   messages rendered by the model's chat template
//
// A request goes through the same GenerationService as a gRPC one (authentication with
// "Authorization: Bearer <key>", validation, the prompt's tokens, placement, admission limits,
// relay, retry, metrics); only the encoding differs (http_routes.h, http_stream.h). Errors are
// OpenAI's {"error": {...}} objects with the HTTP status ErrorFromStatus gives; 413 for a body over
// max_body_bytes; 503 with Retry-After while draining or above max_connections. A streaming client
// that disconnects cancels its generation (the next write fails; the worker call is cancelled and
// its blocks freed).
//
// Connections (http_connections.h): one waiter thread holds every connection until it has a
// complete request (deadlines header_timeout and body_timeout, caps on open connections in
// all and per client); then a worker thread runs the request (a stream holds it until it
// ends), at most max_connections at once, and a keep-alive connection goes back to waiting.
//
// Thread-safety: Start/Drain/Stop from one thread; requests on the connection threads.
#pragma once

#include <atomic>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/metrics/metrics.h"
#include "engine/runtime/model_front.h"
#include "services/base/grpc_security.h"
#include "services/base/net_address.h"
#include "services/router/openai/openai_request.h"
#include "services/router/openai/tool_parser.h"

namespace pd::router {
class GenerationService;
}  // namespace pd::router

namespace pd::router::openai {

class HttpConnections;
class HttpRoutes;
class LiveStreams;

struct HttpFrontConfig {
  // Numeric address to listen on; port 0 = ephemeral (read it back with port()).
  services::HostPort address{"127.0.0.1", 8000};
  // Request bodies above this are refused with 413.
  int64_t max_body_bytes = 4 << 20;
  // Requests being served at once (each has a worker thread); more get 503 with Retry-After.
  // Connections still waiting for a complete request do not count.
  int64_t max_connections = 4096;
  // Open connections in all, and per client IP address (0 = no cap): more are reset at accept.
  int64_t max_open_connections = 16384;
  int64_t max_connections_per_client = 2048;
  // How long a connection may wait for a request's first byte (a new one, and a keep-alive one
  // between requests); then how long the rest of the head may take, and then the body.
  absl::Duration idle_timeout = absl::Seconds(5);
  absl::Duration header_timeout = absl::Seconds(10);
  absl::Duration body_timeout = absl::Seconds(30);
  // TLS of the HTTP API (the gRPC API's --tls_cert/--tls_key/--tls_ca); unset = plaintext.
  services::TlsServerConfig tls;
  ParseLimits limits;
  // The tool-call format of tool_choice "auto" (--tool_call_format); unset = detected from the
  // chat template (ChooseToolCallFormat in http_routes.h).
  std::optional<ToolCallFormat> tool_call_format;
  // Reasoning blocks in chat output (--reasoning_parser, reasoning_parser.h): "auto" (on when
  // the chat template writes "</think>"), "think" (on) or "none".
  std::string reasoning_parser = "auto";
  // tool_choice "auto" (Hermes format): enforce a call once the model starts one
  // (--constrain_auto_tool_calls; HttpRoutes::ConstrainAutoCalls).
  bool constrain_auto_tool_calls = true;

  absl::Status Validate() const;
};

class HttpFront {
 public:
  // Binds and starts serving. `service` (whose prompts() has the chat template, if any: without
  // one chat requests get a 400 saying the model has none) and `model` must outlive the front.
  // InvalidArgument for a bad config; Unavailable when the address cannot be bound.
  static absl::StatusOr<std::unique_ptr<HttpFront>> Start(const HttpFrontConfig& config,
                                                          GenerationService* service,
                                                          const engine::ModelFront* model,
                                                          metrics::Registry* registry);
  // Stops (Stop) if still running.
  ~HttpFront();

  int port() const;
  // New requests get 503 from now on; waits until the requests in flight are done or
  // `deadline` passes, then stops (Stop cancels what is left).
  void Drain(absl::Time deadline);
  // Stops listening, closes idle connections, cancels the streams and waits for the worker
  // threads.
  void Stop();

 private:
  HttpFront();

  std::atomic<bool> draining_{false};
  std::atomic<bool> stopped_{false};
  std::unique_ptr<LiveStreams> live_;
  std::unique_ptr<HttpRoutes> routes_;
  std::unique_ptr<HttpConnections> connections_;  // destroyed first: its workers use the rest
};

}  // namespace pd::router::openai
