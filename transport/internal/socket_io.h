// Blocking I/O on the connected stream sockets of the backends that run their own connections
// (tcp data and control frames, nccl control frames). The sockets are set up by
// SetStreamSocketOptions (socket_util.h): blocking, with send and receive timeouts of one short
// slice, so one syscall moves as much as the socket buffers allow (a whole chunk with
// MSG_WAITALL) instead of waking per segment, and each timeout hands control back to the
// caller's `keep_going`, which decides whether to wait another slice. Private to transport/.
//
// Free functions; thread-safe as far as the socket is (callers serialize writers per socket).
#pragma once

#include <sys/uio.h>

#include <cstddef>
#include <vector>

#include "absl/functional/function_ref.h"

namespace pd::transport::transport_internal {

enum class SocketIo {
  kOk,       // every byte moved
  kClosed,   // the peer closed the connection (a read returned 0)
  kFailed,   // the socket failed; `*error` (when given) holds the errno
  kStopped,  // a timeout slice passed with bytes left and `keep_going()` returned false
};

// Reads exactly `n` bytes into `buf` (MSG_WAITALL), re-checking `keep_going()` on every timeout
// (and on EINTR).
SocketIo ReadFull(int fd, void* buf, size_t n, absl::FunctionRef<bool()> keep_going,
                  int* error = nullptr);

// Writes all of `iov` (one sendmsg for header + payload, MSG_NOSIGNAL), re-checking
// `keep_going()` on every timeout, i.e. after a whole slice without progress (a stalled peer).
// EINTR retries at once.
SocketIo WriteAll(int fd, std::vector<iovec> iov, absl::FunctionRef<bool()> keep_going,
                  int* error = nullptr);

}  // namespace pd::transport::transport_internal
