// TcpTransport: the plain-socket KvTransport (always built; baseline and fallback).
//
// One listener thread accepts connections; every connection has a reader thread, and every
// outgoing peer a sender thread. Data frames carry (tag, registration nonce, dst block run)
// in a fixed header followed by the blocks, written with sendmsg straight from the registered
// region and read by the receiver straight into the destination region after the run was
// validated against its pending expectation (never trusting the wire). The sender's transfer
// completes when the receiver acknowledges the END frame, so both sides agree on "arrived".
// A closed connection (peer died) fails the transfers riding on it with Unavailable at once;
// a hung peer fails them at their deadline. Private to transport/: use the registry.
//
// Thread-safe.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "transport/kv_transport.h"

namespace pd::transport {

struct TcpTransportOptions {
  std::string listen_host = "127.0.0.1";  // numeric IPv4 address
  int listen_port = 0;                    // 0: any free port
  absl::Duration connect_timeout = absl::Seconds(5);
  uint64_t max_frame_bytes = 4 << 20;  // data frames carry whole blocks, about this much
};

// Binds and starts the listener. Unavailable when the address cannot be bound.
absl::StatusOr<std::unique_ptr<KvTransport>> CreateTcpTransport(const TcpTransportOptions& options);

}  // namespace pd::transport
