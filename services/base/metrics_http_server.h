// MetricsHttpServer: serves a metrics::Registry as Prometheus text over HTTP.
//
//   GET /metrics  -> 200, Content-Type "text/plain; version=0.0.4; charset=utf-8",
//                    body Registry::RenderPrometheus() (collectors run on the request thread)
//   GET /healthz  -> 200, "ok"
//   anything else -> 404
//
//   PD_ASSIGN_OR_RETURN(std::unique_ptr<MetricsHttpServer> http,
//                       MetricsHttpServer::Start(config, &registry));
//   LOG(INFO) << "metrics on port " << http->port();
//
// The HTTP library (cpp-httplib) is an implementation detail: only the .cc includes it.
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/metrics/metrics.h"

namespace httplib {
class Server;
}  // namespace httplib

namespace pd::services {

struct MetricsHttpServerConfig {
  // Numeric IPv4 or IPv6 address to listen on ("0.0.0.0" or "::" for every interface). Host
  // names are not accepted: startup never waits on DNS.
  std::string bind_address = "127.0.0.1";
  // TCP port in [0, 65535]; 0 picks a free ephemeral port (read it back with port()).
  int port = 0;

  // InvalidArgument (message starting "metrics http:") for a bad address or port.
  absl::Status Validate() const;
};

// An HTTP server on its own threads (one acceptor plus a small worker pool) that renders the
// registry on every scrape. Thread-safe: port() and Stop() may be called from any thread.
class MetricsHttpServer {
 public:
  // Validates `config`, binds and listens synchronously, then serves in the background.
  // `registry` is not owned and must outlive the server. Errors (message names the address):
  // InvalidArgument for a bad config or a null registry; Unavailable when the address is in use
  // ("metrics http: cannot bind 127.0.0.1:9100: address already in use"); PermissionDenied for a
  // privileged port; FailedPrecondition for other bind failures (e.g. an address not on this
  // host).
  static absl::StatusOr<std::unique_ptr<MetricsHttpServer>> Start(
      const MetricsHttpServerConfig& config, const metrics::Registry* registry);

  // Stops (see Stop()).
  ~MetricsHttpServer();
  MetricsHttpServer(const MetricsHttpServer&) = delete;
  MetricsHttpServer& operator=(const MetricsHttpServer&) = delete;

  // The bound port: config.port, or the ephemeral port chosen when config.port was 0.
  int port() const { return port_; }
  // The configured bind address.
  const std::string& bind_address() const { return bind_address_; }

  // Closes the listening socket, waits for in-flight requests (an idle keep-alive connection
  // delays this by at most about one second) and joins the threads. After it returns, new
  // connections are refused. Idempotent. Must not be called from a request handler.
  void Stop();

 private:
  MetricsHttpServer(std::unique_ptr<httplib::Server> server, std::string bind_address, int port);

  const std::unique_ptr<httplib::Server> server_;
  const std::string bind_address_;
  const int port_;
  // Set by the accept-loop thread when listen_after_bind() returns.
  std::atomic<bool> accept_loop_exited_{false};

  absl::Mutex mu_;                           // serializes Stop()
  std::thread thread_ ABSL_GUARDED_BY(mu_);  // runs the accept loop; joinable until Stop()
};

}  // namespace pd::services
