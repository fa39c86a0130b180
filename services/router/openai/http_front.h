// HttpFront: pd-router's OpenAI-compatible HTTP API, beside the gRPC one (docs/openai.md).
//
//   GET  /health                200 while a decode worker is up and the router is not draining
//   GET  /v1/models             the served model (with --api_keys_file: needs a key)
//   GET  /v1/models/{id}
//   POST /v1/completions        prompt as text or token ids; stream or one JSON object
//   POST /v1/chat/completions   messages rendered by the model's chat template
//
// A request goes through the same GenerationService as a gRPC one (authentication with
// "Authorization: Bearer <key>", validation, placement, admission limits, relay, retry,
// metrics); only the encoding differs. Errors are OpenAI's {"error": {...}} objects with the
// HTTP status ErrorFromStatus gives; 413 for a body over max_body_bytes; 503 with Retry-After
// while draining or above max_connections. A streaming client that disconnects cancels its
// generation (the next write fails; the worker call is cancelled and its blocks freed).
//
// Each connection is served by its own thread (streams block on the relay), at most
// max_connections of them doing work at once. A connection waiting for its next request (TLS
// or not) sleeps in poll(2), costing no CPU, until the request, idle_timeout or Stop.
//
// Thread-safety: Start/Drain/Stop from one thread; requests on the connection threads.
#pragma once

#include <atomic>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/metrics/metrics.h"
#include "engine/chat/chat_template.h"
#include "engine/runtime/model_front.h"
#include "services/base/grpc_security.h"
#include "services/base/net_address.h"
#include "services/router/openai/openai_request.h"

namespace httplib {
class Server;
struct Request;
struct Response;
}  // namespace httplib

namespace pd::router {
class GenerationService;
}  // namespace pd::router

namespace pd::router::openai {

class LiveStreams;

struct HttpFrontConfig {
  // Numeric address to listen on; port 0 = ephemeral (read it back with port()).
  services::HostPort address{"127.0.0.1", 8000};
  // Request bodies above this are refused with 413.
  int64_t max_body_bytes = 4 << 20;
  // Connections doing work at once; more are answered 503 with Retry-After.
  int64_t max_connections = 4096;
  // An idle keep-alive connection is closed after this long (also how long Stop may wait on one).
  absl::Duration idle_timeout = absl::Seconds(5);
  // TLS of the HTTP API (the gRPC API's --tls_cert/--tls_key/--tls_ca); unset = plaintext.
  services::TlsServerConfig tls;
  ParseLimits limits;

  absl::Status Validate() const;
};

// The chat template for /v1/chat/completions: `file` (a Jinja file, the --chat_template flag)
// when set, else the model's (a Hugging Face directory's tokenizer_config.json chat_template or
// chat_template.jinja); null when the model has none (llama2.c checkpoints). BOS/EOS come from
// the directory's tokenizer_config.json ("" for llama2.c). Errors: NotFound for an unreadable
// file, InvalidArgument for a template that does not parse (naming the file). Its renders are
// bounded by `limits`.
absl::StatusOr<std::unique_ptr<chat::ChatTemplate>> LoadChatTemplate(
    const std::string& model, const std::string& file, const chat::ChatTemplateLimits& limits = {});

class HttpFront {
 public:
  struct ConnectionCount;  // internal

  // Binds and starts serving. `service` and `model` must outlive the front; `chat_template`
  // (may be null: chat requests then get a 400 saying the model has none) is owned.
  // InvalidArgument for a bad config; Unavailable when the address cannot be bound.
  static absl::StatusOr<std::unique_ptr<HttpFront>> Start(
      const HttpFrontConfig& config, GenerationService* service, const engine::ModelFront* model,
      std::unique_ptr<chat::ChatTemplate> chat_template, metrics::Registry* registry);
  // Stops (Stop) if still running.
  ~HttpFront();

  int port() const { return port_; }
  // New requests get 503 from now on; waits until the requests in flight are done or
  // `deadline` passes, then stops (Stop cancels what is left).
  void Drain(absl::Time deadline);
  // Stops listening, closes idle connections and waits for the connection threads.
  void Stop();

 private:
  struct Metrics {
    metrics::Family<metrics::Counter>* requests = nullptr;  // {path, status}
  };

  HttpFront() = default;
  void Route();
  void HandleModels(const httplib::Request& req, httplib::Response& res);
  void HandleGenerate(Endpoint endpoint, const httplib::Request& req, httplib::Response& res);
  // The request to send through the router; `echo` gets the prompt's text when asked.
  absl::StatusOr<pdserve::v1::GenerateRequest> ToGenerateRequest(const OpenAiRequest& r,
                                                                 std::string* echo) const;
  // OK when the request may go on (not draining, not over max_connections).
  absl::Status Admit() const;
  void Reply(httplib::Response& res, const absl::Status& status);

  HttpFrontConfig config_;
  GenerationService* service_ = nullptr;
  const engine::ModelFront* model_ = nullptr;
  std::unique_ptr<chat::ChatTemplate> chat_template_;
  Metrics metrics_;
  metrics::Registry* registry_ = nullptr;
  std::optional<metrics::CollectorId> collector_;  // pd_router_http_connections
  std::unique_ptr<httplib::Server> server_;
  std::shared_ptr<ConnectionCount> connections_;
  std::unique_ptr<LiveStreams> live_;
  std::atomic<bool> accept_loop_exited_{false};
  std::thread listener_;
  int wake_fd_ = -1;  // eventfd Stop signals: wakes the plaintext connections' waits
  int port_ = 0;
  std::atomic<bool> draining_{false};
  std::atomic<bool> stopped_{false};
};

}  // namespace pd::router::openai
