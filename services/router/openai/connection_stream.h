// Private to services/router/openai (http_connections.cc): one HTTP connection as the waiter
// and the worker threads share it, and the stream httplib's parser runs on for a buffered
// request. Not for other folders: it speaks OpenSSL's and httplib's types.
#pragma once

#include <sys/socket.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <utility>

#include "absl/time/time.h"
#include "services/router/openai/request_framing.h"

typedef struct ssl_st SSL;  // OpenSSL's own forward declaration

namespace httplib {
class Stream;
}  // namespace httplib

namespace pd::router::openai::http_internal {

// Requests served on one keep-alive connection before it is closed.
inline constexpr size_t kMaxRequestsPerConnection = 100000;
inline constexpr char kContinue[] = "HTTP/1.1 100 Continue\r\n\r\n";

// One accepted connection. The waiter owns it while it waits (in epoll and a timer); a worker
// has it, alone, while its request is served (phase kServing).
struct Conn {
  enum class Phase { kHandshake, kIdle, kHead, kBody, kServing, kLinger };

  Conn(int fd, std::string peer, int peer_port, FramingLimits limits)
      : fd(fd), peer(std::move(peer)), peer_port(peer_port), framer(limits) {}

  const int fd;
  const std::string peer;  // numeric IP: the per-client cap's key
  const int peer_port;
  SSL* ssl = nullptr;  // owned; null for plaintext
  Phase phase = Phase::kIdle;
  std::multimap<absl::Time, Conn*>::iterator timer;
  bool has_timer = false;
  uint32_t interest = 0;     // epoll events registered; 0 = not in epoll
  bool tls_want_write = false;
  std::string buf;  // bytes read and not yet consumed; a request starts at buf[0]
  RequestFramer framer;
  bool continue_sent = false;
  size_t requests_left = kMaxRequestsPerConnection;
  bool keep = false;  // set by the worker: back to waiting (true) or close
};

// Runs `process` (httplib's process_request) on a stream over `conn`: reads come from the
// request the waiter buffered (conn.buf up to conn.framer.frame_bytes(); its end reads as the
// end of the stream, so the parser never waits on the socket); writes go to the socket
// (non-blocking, each wait one poll(2) of up to `write_timeout`), through OpenSSL for TLS. A
// "100 Continue" the waiter already sent (conn.continue_sent) is not sent twice. While
// `process` runs, CurrentClientGone() on this thread asks about this connection.
bool ServeBuffered(Conn& conn, absl::Duration write_timeout,
                   const std::function<bool(httplib::Stream&)>& process);

// The numeric address of an IPv4 or IPv6 socket address, its port in `port`.
std::string NumericHost(const sockaddr_storage& addr, int* port);

// "HTTP/1.1 <status> ..." with an OpenAI error object and "Connection: close" (Retry-After for
// 503), for the answers the waiter gives itself.
std::string CannedResponse(int status, const std::string& message);

}  // namespace pd::router::openai::http_internal
