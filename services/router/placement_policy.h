// Placement and PlacementPolicy: where one request runs, and the interface that decides it.
// Implementations: ScoredPlacementPolicy (placement.h). Users: GenerationService (first
// placement) and RouterStream (the retry after a decode worker failed).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/hash/block_hash.h"
#include "services/router/worker_pool.h"

namespace pd::router {

// Where one request runs.
struct Placement {
  int decode_index = -1;
  int prefill_index = -1;  // -1 = prefill on the decode worker
  std::string reason;      // for metrics: "round_robin", "random", "cache_hit", "load"
  // "remote_prefill", "below_disagg_threshold" or "no_prefill_worker" (metrics).
  std::string prefill_reason;
  int64_t cached_blocks = 0;  // leading prompt blocks the decode worker holds (per the index)
  int64_t new_blocks = 0;     // prompt blocks the decode worker must allocate
};

// Chooses workers for a request. Thread-safe. Implementations: see placement.h.
class PlacementPolicy {
 public:
  virtual ~PlacementPolicy() = default;
  virtual absl::string_view name() const = 0;
  // `chain`: the prompt's block hashes; `workers`: the pool's snapshot. Unavailable when no
  // healthy decode worker exists.
  virtual absl::StatusOr<Placement> Choose(absl::Span<const BlockHash> chain, int64_t prompt_tokens,
                                           const std::vector<WorkerSnapshot>& workers) = 0;
};

}  // namespace pd::router
