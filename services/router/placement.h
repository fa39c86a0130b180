// Placement policies of pd-router (DESIGN.md "Router scoring"): round_robin and random are the
// baselines; cache_aware scores workers by the prefix blocks they hold (KvIndex) and their load.
#pragma once

#include <atomic>
#include <memory>
#include <random>
#include <string>

#include "absl/synchronization/mutex.h"
#include "services/router/generation_service.h"

namespace pd::router {

// Baseline: decode workers in turn; prefill workers in turn (never the decode worker itself).
// Prompts shorter than `disagg_threshold_tokens` stay on the decode worker.
class RoundRobinPolicy final : public PlacementPolicy {
 public:
  explicit RoundRobinPolicy(int64_t disagg_threshold_tokens)
      : threshold_(disagg_threshold_tokens) {}
  absl::string_view name() const override { return "round_robin"; }
  absl::StatusOr<Placement> Choose(absl::Span<const BlockHash> chain, int64_t prompt_tokens,
                                   const std::vector<WorkerSnapshot>& workers) override;

 private:
  const int64_t threshold_;
  std::atomic<uint64_t> decode_cursor_{0};
  std::atomic<uint64_t> prefill_cursor_{0};
};

// Baseline: uniformly random healthy workers.
class RandomPolicy final : public PlacementPolicy {
 public:
  explicit RandomPolicy(int64_t disagg_threshold_tokens) : threshold_(disagg_threshold_tokens) {}
  absl::string_view name() const override { return "random"; }
  absl::StatusOr<Placement> Choose(absl::Span<const BlockHash> chain, int64_t prompt_tokens,
                                   const std::vector<WorkerSnapshot>& workers) override;

 private:
  const int64_t threshold_;
  absl::Mutex mu_;
  std::mt19937_64 gen_ ABSL_GUARDED_BY(mu_){std::random_device{}()};
};

// The policy named by config.policy. InvalidArgument for an unknown name.
absl::StatusOr<std::unique_ptr<PlacementPolicy>> MakePlacementPolicy(const RouterConfig& config);

}  // namespace pd::router
