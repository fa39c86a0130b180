#include "transport/internal/socket_io.h"

#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <climits>

namespace pd::transport::transport_internal {

SocketIo ReadFull(int fd, void* buf, size_t n, absl::FunctionRef<bool()> keep_going, int* error) {
  char* p = static_cast<char*>(buf);
  while (n > 0) {
    const ssize_t r = ::recv(fd, p, n, MSG_WAITALL);
    if (r > 0) {
      p += r;
      n -= static_cast<size_t>(r);
    } else if (r == 0) {
      return SocketIo::kClosed;
    } else if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) {
      if (!keep_going()) {
        return SocketIo::kStopped;
      }
    } else {
      if (error != nullptr) {
        *error = errno;
      }
      return SocketIo::kFailed;
    }
  }
  return SocketIo::kOk;
}

SocketIo WriteAll(int fd, std::vector<iovec> iov, absl::FunctionRef<bool()> keep_going,
                  int* error) {
  size_t first = 0;
  while (first < iov.size()) {
    msghdr msg{};
    msg.msg_iov = iov.data() + first;
    msg.msg_iovlen = std::min<size_t>(iov.size() - first, IOV_MAX);
    const ssize_t n = ::sendmsg(fd, &msg, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) {
        continue;
      }
      if (errno != EAGAIN && errno != EWOULDBLOCK) {
        if (error != nullptr) {
          *error = errno;
        }
        return SocketIo::kFailed;
      }
      if (!keep_going()) {  // a whole slice without progress
        return SocketIo::kStopped;
      }
      continue;
    }
    size_t left = static_cast<size_t>(n);
    while (first < iov.size() && left >= iov[first].iov_len) {
      left -= iov[first].iov_len;
      ++first;
    }
    if (first < iov.size()) {
      iov[first].iov_base = static_cast<char*>(iov[first].iov_base) + left;
      iov[first].iov_len -= left;
    }
  }
  return SocketIo::kOk;
}

}  // namespace pd::transport::transport_internal
