#include "transport/internal/socket_util.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace pd::transport::transport_internal {

absl::StatusOr<sockaddr_in> Ipv4Address(absl::string_view host, int port) {
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (::inet_pton(AF_INET, std::string(host).c_str(), &addr.sin_addr) != 1) {
    return absl::InvalidArgumentError(absl::StrCat("not a numeric IPv4 address: ", host));
  }
  return addr;
}

absl::StatusOr<ListeningSocket> ListenTcp(absl::string_view host, int port,
                                          absl::string_view backend) {
  absl::StatusOr<sockaddr_in> addr = Ipv4Address(host, port);
  if (!addr.ok()) {
    return addr.status();
  }
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    return absl::InternalError(absl::StrCat("socket: ", std::strerror(errno)));
  }
  int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  socklen_t len = sizeof(*addr);
  if (::bind(fd, reinterpret_cast<const sockaddr*>(&*addr), sizeof(*addr)) != 0 ||
      ::listen(fd, 64) != 0 || ::getsockname(fd, reinterpret_cast<sockaddr*>(&*addr), &len) != 0) {
    absl::Status s = absl::UnavailableError(
        absl::StrCat(backend, " listen ", host, ":", port, ": ", std::strerror(errno)));
    ::close(fd);
    return s;
  }
  return ListeningSocket{fd, absl::StrCat(host, ":", ntohs(addr->sin_port))};
}

absl::StatusOr<int> DialTcp(absl::string_view address, absl::Duration timeout,
                            absl::string_view backend) {
  std::vector<absl::string_view> hp = absl::StrSplit(address, absl::MaxSplits(':', 1));
  int port = 0;
  if (hp.size() != 2 || !absl::SimpleAtoi(hp[1], &port)) {
    return absl::InvalidArgumentError(absl::StrCat("bad ", backend, " address: ", address));
  }
  absl::StatusOr<sockaddr_in> addr = Ipv4Address(hp[0], port);
  if (!addr.ok()) {
    return addr.status();
  }
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) {
    return absl::InternalError(absl::StrCat("socket: ", std::strerror(errno)));
  }
  int err = 0;
  if (::connect(fd, reinterpret_cast<const sockaddr*>(&*addr), sizeof(*addr)) != 0 &&
      errno != EINPROGRESS) {
    err = errno;
  } else {
    pollfd p{fd, POLLOUT, 0};
    socklen_t len = sizeof(err);
    if (::poll(&p, 1, static_cast<int>(absl::ToInt64Milliseconds(timeout))) != 1) {
      err = ETIMEDOUT;
    } else if (::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0) {
      err = errno;
    }
  }
  if (err != 0) {
    ::close(fd);
    return absl::UnavailableError(
        absl::StrCat(backend, " connect ", address, ": ", std::strerror(err)));
  }
  return fd;
}

void SetStreamSocketOptions(int fd, absl::Duration slice) {
  const int flags = ::fcntl(fd, F_GETFL, 0);
  if (flags >= 0) {
    ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
  }
  timeval tv = absl::ToTimeval(slice);
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

int AcceptTcp(int listen_fd, absl::Duration slice) {
  pollfd p{listen_fd, POLLIN, 0};
  if (::poll(&p, 1, static_cast<int>(absl::ToInt64Milliseconds(slice))) <= 0) {
    return -1;
  }
  const int fd = ::accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
  if (fd >= 0) {
    SetStreamSocketOptions(fd, slice);
  }
  return fd;
}

}  // namespace pd::transport::transport_internal
