#include "services/router/router_config.h"

#include <cmath>
#include <tuple>

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
  if (model.empty()) {
    return absl::InvalidArgumentError("--model is required (the model the workers serve)");
  }
  if (decode_workers.empty()) {
    return absl::InvalidArgumentError("--decode_workers is empty: list at least one worker");
  }
  if (policy != "cache_aware" && policy != "round_robin" && policy != "random") {
    return absl::InvalidArgumentError(
        absl::StrCat("--policy must be cache_aware, round_robin or random, got '", policy, "'"));
  }
  for (const auto& [flag, value, max] :
       {std::tuple<const char*, double, double>{"--prefill_weight", prefill_weight, -1},
        {"--dram_hit_weight", dram_hit_weight, 1},
        {"--nvme_hit_weight", nvme_hit_weight, 1},
        {"--remote_hit_weight", remote_hit_weight, 1},
        {"--decode_load_weight", decode_load_weight, -1},
        {"--inflight_weight", inflight_weight, -1},
        {"--inflight_blocks_weight", inflight_blocks_weight, -1},
        {"--backlog_prefill_weight", backlog_prefill_weight, -1},
        {"--min_hit_fraction", min_hit_fraction, 1}}) {
    if (!std::isfinite(value) || value < 0 || (max >= 0 && value > max)) {
      return absl::InvalidArgumentError(absl::StrCat(
          flag, " must be ", max >= 0 ? absl::StrCat("in [0, ", max, "]") : std::string(">= 0"),
          ", got ", value));
    }
  }
  if (index_max_blocks < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--index_max_blocks must be >= 0 (0 = automatic), got ", index_max_blocks));
  }
  if (disagg_threshold_tokens < 0) {
    return absl::InvalidArgumentError("--disagg_threshold_tokens must be >= 0");
  }
  if (max_inflight <= 0) {
    return absl::InvalidArgumentError("--max_inflight must be > 0");
  }
  if (max_streams_per_tenant < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--max_streams_per_tenant must be >= 0 (0 = unbounded), got ", max_streams_per_tenant));
  }
  if (max_migrations < 0 || max_migrations > 100) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max_migrations must be in [0, 100], got ", max_migrations));
  }
  if (max_message_bytes < 1024 || max_message_bytes > (int64_t{1} << 30)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max_message_bytes must be in [1024, 1073741824], got ", max_message_bytes));
  }
  if (absl::Status s = tls.Validate(); !s.ok()) return s;
  if (absl::Status s = worker_tls.Validate("--client_tls_"); !s.ok()) return s;
  if (health_interval <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("--health_interval must be > 0");
  }
  if (health_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("--health_timeout must be > 0");
  }
  if (redis_lookup_timeout < absl::Milliseconds(1) || redis_lookup_timeout > absl::Seconds(10)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--redis_lookup_timeout must be in [1ms, 10s], got ",
                     absl::FormatDuration(redis_lookup_timeout)));
  }
  if (health_missed_checks < 1 || health_missed_checks > 100) {
    return absl::InvalidArgumentError(
        absl::StrCat("--health_missed_checks must be in [1, 100], got ", health_missed_checks));
  }
  return limits.Validate();
}

}  // namespace pd::router
