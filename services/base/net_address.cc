#include "services/base/net_address.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace pd::services {

std::string HostPort::ToString() const {
  if (host.find(':') != std::string::npos) {
    return absl::StrCat("[", host, "]:", port);
  }
  return absl::StrCat(host, ":", port);
}

absl::StatusOr<HostPort> ParseHostPort(absl::string_view text, absl::string_view what) {
  HostPort out;
  absl::string_view port_text;
  if (!text.empty() && text.front() == '[') {
    size_t close = text.find(']');
    if (close == absl::string_view::npos || close + 1 >= text.size() || text[close + 1] != ':') {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": expected [ipv6]:port, got \"", text, "\""));
    }
    out.host = std::string(text.substr(1, close - 1));
    port_text = text.substr(close + 2);
  } else {
    size_t colon = text.rfind(':');
    if (colon == absl::string_view::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": expected host:port, got \"", text, "\""));
    }
    out.host = std::string(text.substr(0, colon));
    port_text = text.substr(colon + 1);
  }
  if (out.host.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": empty host in \"", text, "\""));
  }
  if (!absl::SimpleAtoi(port_text, &out.port) || out.port < 0 || out.port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": port must be a number in [0, 65535], got \"", port_text, "\""));
  }
  return out;
}

absl::Status CheckCanListen(const HostPort& address, absl::string_view what) {
  if (address.port == 0) {
    return absl::OkStatus();
  }
  sockaddr_storage storage{};
  socklen_t len = 0;
  const std::string host = address.host == "localhost" ? "127.0.0.1" : address.host;
  auto* v4 = reinterpret_cast<sockaddr_in*>(&storage);
  auto* v6 = reinterpret_cast<sockaddr_in6*>(&storage);
  if (inet_pton(AF_INET, host.c_str(), &v4->sin_addr) == 1) {
    v4->sin_family = AF_INET;
    v4->sin_port = htons(static_cast<uint16_t>(address.port));
    len = sizeof(*v4);
  } else if (inet_pton(AF_INET6, host.c_str(), &v6->sin6_addr) == 1) {
    v6->sin6_family = AF_INET6;
    v6->sin6_port = htons(static_cast<uint16_t>(address.port));
    len = sizeof(*v6);
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": host must be a numeric IP address or localhost, got \"", address.host, "\""));
  }
  int fd = ::socket(storage.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    return absl::InternalError(absl::StrCat(what, ": socket: ", std::strerror(errno)));
  }
  int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  const int rc = ::bind(fd, reinterpret_cast<sockaddr*>(&storage), len);
  const int err = errno;
  ::close(fd);
  if (rc == 0) {
    return absl::OkStatus();
  }
  std::string cause = std::strerror(err);
  if (!cause.empty()) {
    cause[0] = absl::ascii_tolower(static_cast<unsigned char>(cause[0]));  // messages are lower-case
  }
  const std::string msg = absl::StrCat(what, " ", address.ToString(), ": cannot listen: ", cause);
  switch (err) {
    case EADDRINUSE:
      return absl::UnavailableError(msg);
    case EACCES:
      return absl::PermissionDeniedError(msg);
    case EADDRNOTAVAIL:
      return absl::InvalidArgumentError(msg);
    default:
      return absl::FailedPreconditionError(msg);
  }
}

std::string HostName() {
  char host[256] = {};
  ::gethostname(host, sizeof(host) - 1);
  return host;
}

}  // namespace pd::services
