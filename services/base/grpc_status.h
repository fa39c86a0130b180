// The one place where absl::Status and grpc::Status convert (codes map 1:1, message kept).
#pragma once

#include <grpcpp/support/status.h>

#include "absl/status/status.h"

namespace pd::services {

// In the UNAVAILABLE message of a stream a worker ends because it drains (SIGTERM): the router
// moves such a stream to another worker (docs/migration.md) and counts it as a drain.
inline constexpr char kWorkerDrainingMessage[] = "worker draining";

grpc::Status ToGrpcStatus(const absl::Status& status);
absl::Status FromGrpcStatus(const grpc::Status& status);

}  // namespace pd::services
