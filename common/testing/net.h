// Test helpers for loopback networking. Test-only: linked by tests, never by binaries.
#pragma once

#include "absl/status/statusor.h"

namespace pd::testing {

// Returns a TCP port on 127.0.0.1 that was free at the time of the call (bound with port 0,
// then released). Racy by nature: callers that start a server on it must retry on EADDRINUSE.
// Errors: Internal when no socket could be bound.
absl::StatusOr<int> PickFreeLoopbackPort();

// A TCP socket connected to 127.0.0.1:`port` (blocking; the caller closes it). Unavailable,
// naming the port and errno, when the connection is refused or fails.
absl::StatusOr<int> ConnectLoopback(int port);

}  // namespace pd::testing
