#include "services/worker/worker_config.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/status_macros.h"
#include "transport/registry.h"

namespace pd::worker {

absl::StatusOr<WorkerRole> ParseRole(absl::string_view name) {
  if (name == "prefill") return WorkerRole::kPrefill;
  if (name == "decode") return WorkerRole::kDecode;
  if (name == "both") return WorkerRole::kBoth;
  return absl::InvalidArgumentError(
      absl::StrCat("--role must be prefill, decode or both, got '", name, "'"));
}

absl::string_view RoleName(WorkerRole role) {
  switch (role) {
    case WorkerRole::kPrefill:
      return "prefill";
    case WorkerRole::kDecode:
      return "decode";
    case WorkerRole::kBoth:
      return "both";
  }
  return "unknown";
}

absl::Status WorkerConfig::Validate() const {
  PD_RETURN_IF_ERROR(runtime.Validate());
  if (transport.empty()) {
    return absl::InvalidArgumentError("--transport is empty");
  }
  if (!transport::IsTransportBuilt(transport)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--transport '", transport, "' is not available in this build (known: ",
                     absl::StrJoin(transport::KnownTransports(), ", "), ")"));
  }
  if (prefill_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("--prefill_timeout must be > 0");
  }
  if (tier_offer_slots < -1 || tier_offer_slots > 4096) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--tier_offer_slots must be in [-1, 4096] (-1 = automatic), got ", tier_offer_slots));
  }
  if (tier_write_through && tierd_address.empty()) {
    return absl::InvalidArgumentError(
        "--tier_write_through needs --tierd_address (the node's pd-tierd to write to)");
  }
  if (drain_timeout < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("--drain_timeout must be >= 0");
  }
  if (kv_staging_blocks < 0 || (kv_staging_blocks > 0 && !runtime.tp_rank_pools)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--kv_staging_blocks must be >= 0 and is for --tp_kv_pools=per_rank only, got ",
        kv_staging_blocks));
  }
  if (runtime.kv_blocks > 0 && kv_staging_blocks > runtime.kv_blocks) {
    return absl::InvalidArgumentError(
        absl::StrCat("--kv_staging_blocks ", kv_staging_blocks, " is more than --kv_blocks ",
                     runtime.kv_blocks, " (no transfer needs more blocks than the pool has)"));
  }
  PD_RETURN_IF_ERROR(tls.Validate());
  PD_RETURN_IF_ERROR(peer_tls.Validate("--client_tls_"));
  return absl::OkStatus();
}

int64_t StagingBlocksFor(int64_t kv_blocks, int64_t block_size, int64_t context_tokens) {
  const int64_t sequence = (context_tokens + block_size - 1) / block_size;
  return std::clamp<int64_t>(std::max(kv_blocks / 4, sequence), 1, std::max<int64_t>(1, kv_blocks));
}

}  // namespace pd::worker
