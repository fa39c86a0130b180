#include "services/router/placement.h"

#include <vector>

#include "absl/strings/str_cat.h"

namespace pd::router {
namespace {

std::vector<int> Healthy(const std::vector<WorkerSnapshot>& workers, bool decode, int except) {
  std::vector<int> out;
  for (const WorkerSnapshot& w : workers) {
    if (w.healthy && (decode ? w.can_decode : w.can_prefill) && w.index != except) {
      out.push_back(w.index);
    }
  }
  return out;
}

absl::Status NoDecodeWorker(const std::vector<WorkerSnapshot>& workers) {
  return absl::UnavailableError(
      absl::StrCat("no healthy decode worker (", workers.size(), " configured); retry later"));
}

}  // namespace

absl::StatusOr<Placement> RoundRobinPolicy::Choose(absl::Span<const BlockHash> /*chain*/,
                                                   int64_t prompt_tokens,
                                                   const std::vector<WorkerSnapshot>& workers) {
  const std::vector<int> decode = Healthy(workers, true, -1);
  if (decode.empty()) {
    return NoDecodeWorker(workers);
  }
  Placement p;
  p.decode_index = decode[decode_cursor_++ % decode.size()];
  p.reason = "round_robin";
  if (prompt_tokens < threshold_) {
    p.reason = "below_disagg_threshold";
    return p;
  }
  const std::vector<int> prefill = Healthy(workers, false, p.decode_index);
  if (!prefill.empty()) {
    p.prefill_index = prefill[prefill_cursor_++ % prefill.size()];
  }
  return p;
}

absl::StatusOr<Placement> RandomPolicy::Choose(absl::Span<const BlockHash> /*chain*/,
                                               int64_t prompt_tokens,
                                               const std::vector<WorkerSnapshot>& workers) {
  const std::vector<int> decode = Healthy(workers, true, -1);
  if (decode.empty()) {
    return NoDecodeWorker(workers);
  }
  Placement p;
  p.reason = "random";
  absl::MutexLock lock(&mu_);
  p.decode_index = decode[gen_() % decode.size()];
  if (prompt_tokens < threshold_) {
    p.reason = "below_disagg_threshold";
    return p;
  }
  const std::vector<int> prefill = Healthy(workers, false, p.decode_index);
  if (!prefill.empty()) {
    p.prefill_index = prefill[gen_() % prefill.size()];
  }
  return p;
}

absl::StatusOr<std::unique_ptr<PlacementPolicy>> MakePlacementPolicy(const RouterConfig& config) {
  if (config.policy == "round_robin") {
    return std::make_unique<RoundRobinPolicy>(config.disagg_threshold_tokens);
  }
  if (config.policy == "random") {
    return std::make_unique<RandomPolicy>(config.disagg_threshold_tokens);
  }
  return absl::InvalidArgumentError(
      absl::StrCat("--policy '", config.policy, "' is not available (round_robin, random)"));
}

}  // namespace pd::router
