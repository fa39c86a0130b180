#include "services/router/router_config.h"

#include "absl/strings/str_cat.h"

namespace pd::router {

absl::Status RouterConfig::Validate() const {
  if (block_size <= 0 || block_size > 1024) {
    return absl::InvalidArgumentError(
        absl::StrCat("--block_size must be in [1, 1024], got ", block_size));
  }
  if (redis.has_value()) {
    if (absl::Status s = redis->Validate(); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("redis: ", s.message()));
    }
  }
  if (drain_timeout < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("--drain_timeout must be >= 0");
  }
  if (grpc_address.port != 0 && grpc_address.port == metrics_address.port &&
      grpc_address.host == metrics_address.host) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--grpc_address and --metrics_address are the same: ", grpc_address.ToString()));
  }
  return limits.Validate();
}

}  // namespace pd::router
