// HttpConnections: the connections of pd-router's HTTP API (http_front.h), from accept to
// close, with httplib's request parser, routing and writers run on each complete request.
//
// One waiter thread owns every connection that has no complete request: it accepts, runs TLS
// handshakes (non-blocking OpenSSL), and buffers each request in epoll(7) until its head and
// body have arrived (RequestFramer: head up to the empty line, body by Content-Length or
// chunked framing). Such a connection costs its socket and a small record, no thread. Only a
// complete request goes to a worker thread, which runs httplib's process_request on the
// buffered bytes and writes the response; a keep-alive connection then goes back to the
// waiter. A streaming response (SSE) holds its worker until it ends.
//
// Limits (HttpConnectionsConfig; flags in docs/openai.md):
//   - idle_timeout: wait for a request's first byte (a new connection's and a keep-alive's);
//     the connection is then closed quietly.
//   - header_timeout: total time from a request's first byte to the end of its head (for TLS,
//     from accept to the end of the handshake); body_timeout: from the end of the head to the
//     end of the body. Past either: 408 and close.
//   - max_connections: requests being served at once (worker threads). A complete request over
//     it gets 503 with Retry-After; connections still waiting never take these slots.
//   - max_open_connections (all open sockets) and max_connections_per_client (per client IP,
//     0 = none): a connection over either is reset at accept, before any read.
//   - framing errors (RequestFramer) get their 400/411/413/431/501 at once, then close.
// Each trip counts in pd_router_http_connections_refused_total{reason} (reasons: open_limit,
// client_limit, fd_limit, header_timeout, body_timeout, busy, framing) and is logged, at most
// once per 10 s per process with the counts since. Gauges: pd_router_http_connections (open
// connections), pd_router_http_connections_waiting (those without a complete request).
//
// Thread-safety: Create/Start/Shutdown/Stop from one thread; handlers run on worker threads.
#pragma once

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/metrics/metrics.h"
#include "services/base/grpc_security.h"
#include "services/base/net_address.h"

namespace httplib {
class Server;
}  // namespace httplib

namespace pd::router::openai {

struct HttpConnectionsConfig {
  services::HostPort address{"127.0.0.1", 8000};  // port 0 = ephemeral (port() reads it back)
  services::TlsServerConfig tls;                  // unset = plaintext
  int64_t max_body_bytes = 4 << 20;
  int64_t max_head_bytes = 64 << 10;
  int64_t max_connections = 4096;
  int64_t max_open_connections = 16384;
  int64_t max_connections_per_client = 2048;  // 0 = no cap
  absl::Duration idle_timeout = absl::Seconds(5);
  absl::Duration header_timeout = absl::Seconds(10);
  absl::Duration body_timeout = absl::Seconds(30);
  // Each wait of a response write for the client to take bytes.
  absl::Duration write_timeout = absl::Seconds(30);
};

class HttpConnections {
 public:
  // Binds the address and builds the httplib server (TLS when config.tls is set) whose routes
  // the caller adds through server() before Start. Raises the process's open-file soft limit
  // toward its hard limit when it is below max_open_connections plus a margin (a warning says
  // so when it stays below). InvalidArgument for unreadable TLS files; Unavailable when the
  // address cannot be bound; Internal for a failed epoll or eventfd.
  static absl::StatusOr<std::unique_ptr<HttpConnections>> Create(
      const HttpConnectionsConfig& config, metrics::Registry* registry);
  // Stops (Stop) if still running.
  ~HttpConnections();

  // Routes, error handler and logger; only until Start.
  httplib::Server& server();
  int port() const;
  // Starts accepting and serving.
  void Start();
  // Stops accepting and closes every connection without a request in progress; a connection
  // whose request is in progress closes once its response is written (idempotent, returns at
  // once).
  void Shutdown();
  // Shutdown, then waits for the requests in progress to end and for the worker threads.
  void Stop();

  class Impl;

 private:
  explicit HttpConnections(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Callable from a request handler on its worker thread: true when the client of the request
// being served has closed its connection (hang-up or error on the socket, or its end of the
// stream reached with no bytes left to read; for TLS also a received FIN). False when no
// request is being served on this thread.
bool CurrentClientGone();

}  // namespace pd::router::openai
