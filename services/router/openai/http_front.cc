#include "services/router/openai/http_front.h"

#include <httplib.h>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/log/log.h"
#include "services/router/generation_service.h"
#include "services/router/openai/http_connections.h"
#include "services/router/openai/http_routes.h"
#include "services/router/openai/http_stream.h"

namespace pd::router::openai {

absl::Status HttpFrontConfig::Validate() const {
  if (reasoning_parser != "auto" && reasoning_parser != "think" && reasoning_parser != "none") {
    return absl::InvalidArgumentError(absl::StrCat(
        "--reasoning_parser must be auto, think or none, got \"", reasoning_parser, "\""));
  }
  if (address.port < 0 || address.port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("--http_address: bad port ", address.port));
  }
  if (max_body_bytes < 1024) {
    return absl::InvalidArgumentError("--http_max_body_bytes must be at least 1024");
  }
  if (max_connections < 1) {
    return absl::InvalidArgumentError("--http_max_connections must be at least 1");
  }
  if (max_open_connections < max_connections) {
    return absl::InvalidArgumentError(
        "--http_max_open_connections must be at least --http_max_connections");
  }
  if (max_connections_per_client < 0) {
    return absl::InvalidArgumentError(
        "--http_max_connections_per_client must be 0 (no cap) or more");
  }
  if (idle_timeout < absl::Seconds(1)) {
    return absl::InvalidArgumentError("--http_idle_timeout must be at least 1s");
  }
  if (header_timeout < absl::Seconds(1)) {
    return absl::InvalidArgumentError("--http_header_timeout must be at least 1s");
  }
  if (body_timeout < absl::Seconds(1)) {
    return absl::InvalidArgumentError("--http_body_timeout must be at least 1s");
  }
  return absl::OkStatus();
}

HttpFront::HttpFront() = default;

absl::StatusOr<std::unique_ptr<HttpFront>> HttpFront::Start(const HttpFrontConfig& config,
                                                            GenerationService* service,
                                                            const engine::ModelFront* model,
                                                            metrics::Registry* registry) {
  PD_RETURN_IF_ERROR(config.Validate());
  std::unique_ptr<HttpFront> f(new HttpFront());
  f->live_ = std::make_unique<LiveStreams>();
  PD_ASSIGN_OR_RETURN(
      metrics::Family<metrics::Counter> * requests,
      registry->AddCounter("pd_router_http_requests_total",
                           "OpenAI HTTP API requests by path and HTTP status", {"path", "status"}));
  const chat::ChatTemplate* chat_template = service->prompts().chat_template();
  const bool reasoning =
      config.reasoning_parser == "think" ||
      (config.reasoning_parser == "auto" && chat_template != nullptr &&
       TemplateHasThinkBlocks(chat_template->source()));
  f->routes_ = std::make_unique<HttpRoutes>(service, model, config.limits, f->live_.get(),
                                            &f->draining_, requests, config.tool_call_format,
                                            reasoning, config.constrain_auto_tool_calls);
  HttpConnectionsConfig c;
  c.address = config.address;
  c.tls = config.tls;
  c.max_body_bytes = config.max_body_bytes;
  c.max_connections = config.max_connections;
  c.max_open_connections = config.max_open_connections;
  c.max_connections_per_client = config.max_connections_per_client;
  c.idle_timeout = config.idle_timeout;
  c.header_timeout = config.header_timeout;
  c.body_timeout = config.body_timeout;
  PD_ASSIGN_OR_RETURN(f->connections_, HttpConnections::Create(c, registry));
  f->routes_->Register(f->connections_->server());
  f->connections_->Start();
  LOG(INFO) << "http: OpenAI API on " << config.address.host << ":" << f->connections_->port()
            << (config.tls.enabled() ? " (tls)" : " (plaintext)") << "; tool calls read as "
            << ToolCallFormatName(f->routes_->tool_call_format())
            << (config.tool_call_format.has_value() ? " (--tool_call_format)" : " (detected)")
            << "; reasoning blocks " << (reasoning ? "parsed" : "not parsed") << " ("
            << config.reasoning_parser << ")"
            << (f->routes_->tool_call_format() == ToolCallFormat::kHermes ||
                        f->routes_->tool_call_format() == ToolCallFormat::kDeepseek
                    ? (config.constrain_auto_tool_calls ? "; auto tool calls enforced once started"
                                                        : "; auto tool calls parsed only")
                    : "");
  return f;
}

HttpFront::~HttpFront() { Stop(); }

int HttpFront::port() const { return connections_->port(); }

void HttpFront::Drain(absl::Time deadline) {
  draining_ = true;
  live_->WaitIdle(deadline);
  Stop();
}

void HttpFront::Stop() {
  if (stopped_.exchange(true) || connections_ == nullptr) return;
  draining_ = true;
  connections_->Shutdown();  // no new connections; idle ones close now
  live_->CancelAll();        // the worker threads wait on their streams' ends
  connections_->Stop();
}

}  // namespace pd::router::openai
