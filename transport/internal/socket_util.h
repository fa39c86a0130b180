// TCP socket set-up shared by the backends that run their own control connections (tcp, nccl):
// numeric IPv4 addresses, a listening socket on a chosen or free port, accepting with a bounded
// wait, a connect bounded by a timeout, and the options their connected sockets run with (see
// socket_io.h for the I/O on them). Private to transport/. Loopback or the address the operator
// configures only. Free functions; thread-safe.
#pragma once

#include <netinet/in.h>

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace pd::transport::transport_internal {

// `host` (numeric IPv4) and `port`; InvalidArgument naming the host otherwise.
absl::StatusOr<sockaddr_in> Ipv4Address(absl::string_view host, int port);

struct ListeningSocket {
  int fd = -1;          // owned by the caller
  std::string address;  // "host:port" with the bound port (peers dial it)
};

// A blocking listening socket (SO_REUSEADDR, backlog 64) on host:port, port 0 = a free one.
// InvalidArgument for a bad host; Unavailable naming "<backend> listen host:port" and errno.
absl::StatusOr<ListeningSocket> ListenTcp(absl::string_view host, int port,
                                          absl::string_view backend);

// A socket connected to "host:port" within `timeout` (left non-blocking; the caller sets its
// options). InvalidArgument naming "<backend> address" for a malformed address; Unavailable
// naming "<backend> connect address" and the error or the timeout.
absl::StatusOr<int> DialTcp(absl::string_view address, absl::Duration timeout,
                            absl::string_view backend);

// Makes a connected socket what ReadFull/WriteAll (socket_io.h) expect: blocking, with send and
// receive timeouts of `slice` (one syscall moves as much as the socket buffers allow, and a
// timeout returns control to re-check whether to keep going), and TCP_NODELAY.
void SetStreamSocketOptions(int fd, absl::Duration slice);

// Waits up to `slice` for a connection on `listen_fd` and accepts it (close-on-exec, with
// SetStreamSocketOptions(fd, slice)). -1 when none arrived or the accept failed; callers loop.
int AcceptTcp(int listen_fd, absl::Duration slice);

}  // namespace pd::transport::transport_internal
