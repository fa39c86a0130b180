#include "services/router/openai/connection_stream.h"

#include <arpa/inet.h>
#include <httplib.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <poll.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "services/router/openai/http_connections.h"
#include "services/router/openai/openai_response.h"

namespace pd::router::openai {
namespace http_internal {
namespace {

// Waits up to `timeout` for `events` on `sock`, in one poll(2). True when `sock` is ready (or
// has hung up or failed: the next write tells which); false on timeout.
bool WaitFor(int sock, int16_t events, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  for (;;) {
    pollfd fd = {sock, events, 0};
    const int64_t left_ms = std::max<int64_t>(0, absl::ToInt64Milliseconds(deadline - absl::Now()));
    const int n = ::poll(&fd, 1, static_cast<int>(std::min<int64_t>(left_ms, INT32_MAX)));
    if (n < 0 && errno == EINTR) continue;
    return n > 0;
  }
}

// The stream httplib's parser reads and writes on a worker: reads come from the request the
// waiter buffered (the end of that request reads as the end of the stream: the parser never
// waits on the socket); writes go to the socket (non-blocking; each wait a single poll(2)),
// through OpenSSL for TLS. A "100 Continue" the waiter already sent is not sent twice.
class ConnectionStream final : public httplib::Stream {
 public:
  ConnectionStream(Conn& conn, absl::Duration write_timeout)
      : conn_(conn), frame_(conn.framer.frame_bytes()), write_timeout_(write_timeout) {}

  bool is_readable() const override { return read_ < frame_; }

  // httplib's meaning: writable within the write timeout, and the peer has not closed (a
  // streaming client that went away is noticed before the next chunk is generated).
  bool is_writable() const override {
    if (!WaitFor(conn_.fd, POLLOUT, write_timeout_)) return false;
    pollfd fd = {conn_.fd, POLLIN, 0};
    if (::poll(&fd, 1, 0) <= 0) return true;
    char byte;
    return ::recv(conn_.fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT) > 0;
  }

  ssize_t read(char* ptr, size_t size) override {
    const size_t n = std::min(size, frame_ - read_);
    std::memcpy(ptr, conn_.buf.data() + read_, n);
    read_ += n;
    return static_cast<ssize_t>(n);
  }

  ssize_t write(const char* ptr, size_t size) override {
    if (conn_.continue_sent && !wrote_ && absl::string_view(ptr, size) == kContinue) {
      wrote_ = true;
      return static_cast<ssize_t>(size);
    }
    wrote_ = true;
    if (!is_writable()) return -1;
    return conn_.ssl != nullptr ? WriteTls(ptr, size) : WritePlain(ptr, size);
  }

  void get_remote_ip_and_port(std::string& ip, int& port) const override {
    ip = conn_.peer;
    port = conn_.peer_port;
  }

  void get_local_ip_and_port(std::string& ip, int& port) const override {
    sockaddr_storage addr{};
    socklen_t len = sizeof(addr);
    if (::getsockname(conn_.fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
      ip = NumericHost(addr, &port);
    }
  }

  socket_t socket() const override { return conn_.fd; }

  // CurrentClientGone's answer for this connection.
  bool ClientGone() const {
    pollfd p = {conn_.fd, static_cast<int16_t>(POLLIN | POLLRDHUP), 0};
    if (::poll(&p, 1, 0) <= 0) return false;
    if ((p.revents & (POLLHUP | POLLERR)) != 0) return true;
    // A TLS client's close_notify is unread bytes ahead of its FIN.
    if (conn_.ssl != nullptr && (p.revents & POLLRDHUP) != 0) return true;
    char byte;
    return (p.revents & POLLIN) != 0 && ::recv(conn_.fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT) == 0;
  }

 private:
  ssize_t WritePlain(const char* ptr, size_t size) {
    for (;;) {
      const ssize_t n = ::send(conn_.fd, ptr, size, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n >= 0) return n;
      if (errno == EINTR) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) return -1;
      if (!WaitFor(conn_.fd, POLLOUT, write_timeout_)) return -1;
    }
  }

  ssize_t WriteTls(const char* ptr, size_t size) {
    const int want = static_cast<int>(std::min<size_t>(size, INT32_MAX));
    for (;;) {
      ERR_clear_error();
      const int n = SSL_write(conn_.ssl, ptr, want);
      if (n > 0) return n;
      const int err = SSL_get_error(conn_.ssl, n);
      const int16_t events = err == SSL_ERROR_WANT_READ    ? POLLIN
                             : err == SSL_ERROR_WANT_WRITE ? POLLOUT
                                                           : 0;
      if (events == 0 || !WaitFor(conn_.fd, events, write_timeout_)) return -1;
    }
  }

  Conn& conn_;
  const size_t frame_;
  const absl::Duration write_timeout_;
  size_t read_ = 0;
  bool wrote_ = false;
};

thread_local const ConnectionStream* t_current_stream = nullptr;

}  // namespace

std::string NumericHost(const sockaddr_storage& addr, int* port) {
  char host[INET6_ADDRSTRLEN] = "";
  if (addr.ss_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(&addr);
    ::inet_ntop(AF_INET, &in->sin_addr, host, sizeof(host));
    *port = ntohs(in->sin_port);
  } else if (addr.ss_family == AF_INET6) {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(&addr);
    ::inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof(host));
    *port = ntohs(in6->sin6_port);
  }
  return host;
}

bool ServeBuffered(Conn& conn, absl::Duration write_timeout,
                   const std::function<bool(httplib::Stream&)>& process) {
  ConnectionStream strm(conn, write_timeout);
  t_current_stream = &strm;
  const bool ok = process(strm);
  t_current_stream = nullptr;
  return ok;
}

namespace {

const char* ReasonPhrase(int status) {
  switch (status) {
    case 400: return "Bad Request";
    case 408: return "Request Timeout";
    case 411: return "Length Required";
    case 413: return "Payload Too Large";
    case 431: return "Request Header Fields Too Large";
    case 501: return "Not Implemented";
    case 503: return "Service Unavailable";
    default: return "Error";
  }
}

}  // namespace

std::string CannedResponse(int status, const std::string& message) {
  ApiError e;
  if (status == 503) {
    e = ErrorFromStatus(absl::UnavailableError(message));
  } else {
    e.http_status = status;
    e.message = message;
    e.type = status >= 500 ? "server_error" : "invalid_request_error";
    switch (status) {
      case 408: e.code = "request_timeout"; break;
      case 411: e.code = "length_required"; break;
      case 413: e.code = "request_too_large"; break;
      case 431: e.code = "request_header_fields_too_large"; break;
      case 501: e.code = "not_implemented"; break;
      default: e.code = "bad_request"; break;
    }
  }
  const std::string body = ErrorBody(e);
  return absl::StrCat("HTTP/1.1 ", status, " ", ReasonPhrase(status),
                      "\r\nContent-Type: application/json\r\nContent-Length: ", body.size(),
                      "\r\nConnection: close\r\n", status == 503 ? "Retry-After: 1\r\n" : "",
                      "\r\n", body);
}


}  // namespace http_internal

bool CurrentClientGone() {
  return http_internal::t_current_stream != nullptr &&
         http_internal::t_current_stream->ClientGone();
}

}  // namespace pd::router::openai
