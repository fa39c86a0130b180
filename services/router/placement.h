// Placement of pd-router (docs/architecture.md, "Router scoring"): the PlacementPolicy the
// generation service calls, implemented over the WorkerScorer (cache_aware, round_robin, random)
// and the KvIndex of the blocks each worker holds (fed by the workers' KV events).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "services/router/kv_index.h"
#include "services/router/placement_policy.h"
#include "services/router/router_config.h"
#include "services/router/tier_credit.h"
#include "services/router/worker_scorer.h"

namespace pd::router {

// Turns the pool's snapshot into scorer candidates, matches the prompt's chain against the
// index, extends the matches with the lower-tier blocks the workers' nodes hold in Redis (when
// a TierCredit is given) and lets the scorer decide. Every policy matches the chain: the
// disaggregation threshold counts the decode worker's cached tokens under round_robin and random
// too. Thread-safe.
class ScoredPlacementPolicy final : public PlacementPolicy {
 public:
  // `index` may be null (no KV events: every overlap is 0) and must outlive the policy.
  // `tier_credit` may be null (no Redis: no lower-tier credit from the nodes' tierd) and must
  // outlive the policy; when set, every placement asks it to extend the overlaps.
  ScoredPlacementPolicy(std::unique_ptr<WorkerScorer> scorer, const KvIndex* index,
                        int64_t block_size, TierCredit* tier_credit = nullptr);

  absl::string_view name() const override;
  absl::StatusOr<Placement> Choose(absl::Span<const BlockHash> chain, int64_t prompt_tokens,
                                   const std::vector<WorkerSnapshot>& workers) override;

 private:
  const std::unique_ptr<WorkerScorer> scorer_;
  const KvIndex* const index_;
  const int64_t block_size_;
  TierCredit* const tier_credit_;
};

// The scorer's configuration from the router's flags (policy, weights, threshold).
// InvalidArgument naming the flag for an unknown policy or a bad weight.
absl::StatusOr<ScorerConfig> ScorerConfigFor(const RouterConfig& config);

// The policy named by config.policy over `index` and `tier_credit` (each may be null).
absl::StatusOr<std::unique_ptr<PlacementPolicy>> MakePlacementPolicy(
    const RouterConfig& config, const KvIndex* index, TierCredit* tier_credit = nullptr);

}  // namespace pd::router
