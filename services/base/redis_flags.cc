// --redis_address, --redis_password_file, --redis_username, --redis_key_prefix (see
// redis_flags.h).
#include "services/base/redis_flags.h"

#include "absl/flags/flag.h"
#include "common/base/status_macros.h"
#include "services/base/auth.h"
#include "services/base/net_address.h"

ABSL_FLAG(std::string, redis_address, "", "Redis prefix index host:port; empty = no Redis");
ABSL_FLAG(std::string, redis_password_file, "", "file holding the Redis AUTH password");
ABSL_FLAG(std::string, redis_username, "",
          "Redis ACL user to AUTH as (with --redis_password_file); empty = the default user");
ABSL_FLAG(std::string, redis_key_prefix, "pdserve", "prefix of every Redis key of this cluster");

namespace pd::services {

absl::StatusOr<std::optional<redis::RedisConfig>> RedisConfigFromFlags() {
  const std::string address = absl::GetFlag(FLAGS_redis_address);
  if (address.empty()) {
    return std::nullopt;
  }
  PD_ASSIGN_OR_RETURN(HostPort host_port, ParseHostPort(address, "--redis_address"));
  redis::RedisConfig config;
  config.host = host_port.host;
  config.port = host_port.port;
  config.key_prefix = absl::GetFlag(FLAGS_redis_key_prefix);
  config.username = absl::GetFlag(FLAGS_redis_username);
  if (const std::string path = absl::GetFlag(FLAGS_redis_password_file); !path.empty()) {
    PD_ASSIGN_OR_RETURN(config.password, ReadSecretFile(path, "--redis_password_file", 1));
  }
  return config;
}

}  // namespace pd::services
