// The one place where absl::Status and grpc::Status convert (codes map 1:1, message kept).
#pragma once

#include <grpcpp/support/status.h>

#include "absl/status/status.h"

namespace pd::services {

grpc::Status ToGrpcStatus(const absl::Status& status);
absl::Status FromGrpcStatus(const grpc::Status& status);

}  // namespace pd::services
