// Test helpers for loopback networking. Test-only: linked by tests, never by binaries.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace pd::testing {

// Returns a TCP port on 127.0.0.1 that was free at the time of the call (bound with port 0,
// then released). Racy by nature: callers that start a server on it must retry on EADDRINUSE.
// Errors: Internal when no socket could be bound.
absl::StatusOr<int> PickFreeLoopbackPort();

// A TCP socket connected to 127.0.0.1:`port` (blocking; the caller closes it). Unavailable,
// naming the port and errno, when the connection is refused or fails.
absl::StatusOr<int> ConnectLoopback(int port);

// One TCP socket in the LISTEN state: its local address as inet_ntop writes it ("127.0.0.1",
// "0.0.0.0", "::", "::ffff:127.0.0.1") and its port.
struct ListeningSocket {
  std::string ip;
  int port = 0;
  bool IsLoopback() const;  // 127.0.0.0/8, ::1 or ::ffff:127.x.y.z
  std::string ToString() const;
};

// Every TCP socket that process `pid` (0 = this process) listens on: its socket fds
// (/proc/PID/fd) matched by inode against /proc/PID/net/tcp and tcp6. NotFound when the
// process's /proc entries cannot be read (it has ended, or belongs to another user).
absl::StatusOr<std::vector<ListeningSocket>> ListeningTcpSockets(int pid = 0);

}  // namespace pd::testing
