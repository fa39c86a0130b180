#include "services/tierd/tierd_config.h"

#include "absl/strings/str_cat.h"

namespace pd::tierd {

absl::Status TierdConfig::Validate() const {
  if (model.empty()) {
    return absl::InvalidArgumentError("--model is required (the KV layout comes from it)");
  }
  if (block_size <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("--block_size must be > 0, got ", block_size));
  }
  // Upper bounds keep MiB -> bytes far from int64 overflow (1 PiB is beyond any machine).
  constexpr int64_t kMaxMib = int64_t{1} << 30;
  if (dram_mib <= 0 || dram_mib > kMaxMib) {
    return absl::InvalidArgumentError(
        absl::StrCat("--dram_mib must be in [1, ", kMaxMib, "], got ", dram_mib));
  }
  if (nvme_mib < 0 || nvme_mib > kMaxMib) {
    return absl::InvalidArgumentError(
        absl::StrCat("--nvme_mib must be in [0, ", kMaxMib, "], got ", nvme_mib));
  }
  if (!(low_watermark >= 0 && low_watermark < high_watermark && high_watermark <= 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("watermarks must satisfy 0 <= --low_watermark < --high_watermark <= 1, got ",
                     low_watermark, " and ", high_watermark));
  }
  if (lease < absl::Milliseconds(1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--lease must be at least 1ms, got ", absl::FormatDuration(lease)));
  }
  if (!nvme_dir.empty() && nvme_mib <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--nvme_dir ", nvme_dir, " needs --nvme_mib > 0, got ", nvme_mib));
  }
  if (nvme_dir.empty() && nvme_mib > 0) {
    return absl::InvalidArgumentError("--nvme_mib is set but --nvme_dir is empty");
  }
  if (redis.has_value()) {
    if (absl::Status s = redis->Validate(); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("--redis_address: ", s.message()));
    }
    if (redis_entry_ttl < absl::Seconds(1)) {
      return absl::InvalidArgumentError(absl::StrCat("--redis_entry_ttl must be at least 1s, got ",
                                                     absl::FormatDuration(redis_entry_ttl)));
    }
  }
  if (maintenance_interval <= absl::ZeroDuration() ||
      session_idle_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("maintenance interval and session timeout must be > 0");
  }
  if (!peer_transport.empty()) {
    if (peer_transport != "tcp" && peer_transport != "ucx") {
      return absl::InvalidArgumentError(absl::StrCat(
          "--peer_transport must be tcp, ucx or empty (off), got '", peer_transport, "'"));
    }
    if (!redis.has_value()) {
      return absl::InvalidArgumentError(
          "--peer_transport needs --redis_address: peers find each other's blocks there");
    }
    if (tls.enabled() && tls.client_ca_file.empty()) {
      return absl::InvalidArgumentError(
          "--peer_transport with --tls_cert needs --tls_ca: peer tierds verify each other's "
          "certificates with it");
    }
    if (peer_max_reads < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("--peer_max_reads must be >= 1, got ", peer_max_reads));
    }
    if (peer_fetch_policy != "cost" && peer_fetch_policy != "always") {
      return absl::InvalidArgumentError(absl::StrCat(
          "--peer_fetch_policy must be cost or always, got '", peer_fetch_policy, "'"));
    }
    if (peer_fetch_chunk_blocks < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("--peer_fetch_chunk_blocks must be >= 1, got ", peer_fetch_chunk_blocks));
    }
    if (peer_fetch_max_blocks < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("--peer_fetch_max_blocks must be >= 1, got ", peer_fetch_max_blocks));
    }
    if (peer_fetch_timeout <= absl::ZeroDuration()) {
      return absl::InvalidArgumentError(absl::StrCat("--peer_fetch_timeout must be > 0, got ",
                                                     absl::FormatDuration(peer_fetch_timeout)));
    }
  }
  return tls.Validate();
}

}  // namespace pd::tierd
