// ConnectionCaps: the limits on open HTTP connections that pd-router checks when it accepts one,
// before reading a byte: a hard cap on all open connections (--http_max_open_connections) and
// a cap per client IP address (--http_max_connections_per_client; 0 = none). A connection over
// either is closed at once.
//
// Thread-safety: none; the router's connection waiter owns it (http_connections.h).
#pragma once

#include <cstdint>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/string_view.h"

namespace pd::router::openai {

class ConnectionCaps {
 public:
  enum class Verdict {
    kAdmit,        // counted: call Close(client) when the connection closes
    kOpenLimit,    // max_open connections are open
    kClientLimit,  // this client has max_per_client open
  };

  // `max_open` >= 1; `max_per_client` 0 = no per-client cap.
  ConnectionCaps(int64_t max_open, int64_t max_per_client)
      : max_open_(max_open), max_per_client_(max_per_client) {}

  // `client`: the peer's numeric address ("127.0.0.1", "::1"), never anything the client sent.
  Verdict TryOpen(absl::string_view client);
  // Uncounts a connection TryOpen admitted.
  void Close(absl::string_view client);

  int64_t open() const { return open_; }
  // Distinct clients with a connection open (the map holds no others).
  size_t clients() const { return per_client_.size(); }

 private:
  const int64_t max_open_;
  const int64_t max_per_client_;
  int64_t open_ = 0;
  absl::flat_hash_map<std::string, int64_t> per_client_;
};

}  // namespace pd::router::openai
