// The Redis flag group of pd-router and pd-tierd (the two binaries that talk to the cluster's
// Redis prefix index), defined once (names, defaults and help text), and the function that turns
// it into a redis::RedisConfig. Like tls_flags.h, this is the part of those main.cc files they
// share: link pd::services_base_redis_flags only into binaries and their tests, never into a
// library, so that libraries still never read flags.
//
//   --redis_address HOST:PORT   the Redis server; empty = no Redis
//   --redis_password_file PATH  file whose first line is the AUTH password (never a flag value)
//   --redis_username NAME       ACL user to AUTH as (with --redis_password_file)
//   --redis_key_prefix PREFIX   prefix of every Redis key of this cluster ("pdserve")
//
// Thread-compatible: call RedisConfigFromFlags after absl parsed the flags (main's thread).
#pragma once

#include <optional>
#include <string>

#include "absl/flags/declare.h"
#include "absl/status/statusor.h"
#include "common/redis/redis_client.h"

ABSL_DECLARE_FLAG(std::string, redis_address);
ABSL_DECLARE_FLAG(std::string, redis_password_file);
ABSL_DECLARE_FLAG(std::string, redis_username);
ABSL_DECLARE_FLAG(std::string, redis_key_prefix);

namespace pd::services {

// The Redis client config the flags ask for: nullopt when --redis_address is empty (no Redis);
// otherwise host and port from --redis_address, key prefix, username, and the password read from
// --redis_password_file when set. The other RedisConfig fields keep their defaults. Errors
// (InvalidArgument or NotFound) name the flag: a malformed --redis_address, an unreadable or
// malformed --redis_password_file.
absl::StatusOr<std::optional<redis::RedisConfig>> RedisConfigFromFlags();

}  // namespace pd::services
