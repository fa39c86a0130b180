// pd-router's configuration: plain values parsed from flags in main.cc, validated once.
#pragma once

#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/redis/redis_client.h"
#include "services/base/net_address.h"
#include "services/router/request_validation.h"

namespace pd::router {

struct RouterConfig {
  // Public gRPC API (pdserve.v1.Generation + grpc.health.v1). Port 0 = ephemeral (tests).
  services::HostPort grpc_address{"127.0.0.1", 50051};
  // Prometheus /metrics and /healthz over HTTP. Port 0 = ephemeral.
  services::HostPort metrics_address{"127.0.0.1", 9100};
  // The cluster's Redis prefix index; unset = run without Redis (no lower-tier credit). The
  // password comes from --redis_password_file, never from a flag value.
  std::optional<redis::RedisConfig> redis;
  // Tokens per KV block; must equal the workers' block size.
  int block_size = 16;
  // How long SIGTERM waits for in-flight streams before cancelling them.
  absl::Duration drain_timeout = absl::Seconds(30);
  RequestLimits limits;

  // InvalidArgument naming the flag (e.g. "--block_size") and the bad value.
  absl::Status Validate() const;
};

}  // namespace pd::router
