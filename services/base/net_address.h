// host:port parsing and a startup check that a listening port is free, so services can fail
// with one clear line instead of a gRPC core log dump.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace pd::services {

struct HostPort {
  std::string host;  // numeric IPv4, bracket-less IPv6, or "localhost"
  int port = 0;      // 0..65535; 0 = pick an ephemeral port where allowed

  // "host:port", IPv6 hosts in brackets.
  std::string ToString() const;
};

// Parses "host:port" or "[v6]:port". `what` names the setting in errors, e.g.
// "--grpc_address". InvalidArgument on a missing port, a non-numeric or out-of-range port, or
// an empty host.
absl::StatusOr<HostPort> ParseHostPort(absl::string_view text, absl::string_view what);

// This machine's host name (gethostname), the default node name of workers and tierd.
std::string HostName();

// Tries to bind a TCP socket to `address` (SO_REUSEADDR, like gRPC and httplib) and releases
// it. Unavailable "<what> 127.0.0.1:50051: address already in use" when taken;
// InvalidArgument when the host is not a local numeric address; PermissionDenied for
// privileged ports. Port 0 always succeeds.
absl::Status CheckCanListen(const HostPort& address, absl::string_view what);

}  // namespace pd::services
