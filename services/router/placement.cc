#include "services/router/placement.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"

namespace pd::router {

ScoredPlacementPolicy::ScoredPlacementPolicy(std::unique_ptr<WorkerScorer> scorer,
                                             const KvIndex* index, int64_t block_size,
                                             TierCredit* tier_credit)
    : scorer_(std::move(scorer)),
      index_(index),
      block_size_(block_size),
      tier_credit_(tier_credit) {}

absl::string_view ScoredPlacementPolicy::name() const {
  return PolicyName(scorer_->config().policy);
}

absl::StatusOr<Placement> ScoredPlacementPolicy::Choose(
    absl::Span<const BlockHash> chain, int64_t prompt_tokens,
    const std::vector<WorkerSnapshot>& workers) {
  std::vector<WorkerCandidate> candidates(workers.size());
  for (size_t i = 0; i < workers.size(); ++i) {
    const WorkerSnapshot& w = workers[i];
    WorkerCandidate& c = candidates[i];
    c.worker_id = w.worker_id;
    c.address = w.address;
    c.healthy = w.healthy;
    c.can_prefill = w.can_prefill;
    c.can_decode = w.can_decode;
    // The load report is up to one health interval old: correct it by what this router placed
    // or saw finish since it was requested. Streams that ended lower the load at once, so
    // short requests in a row do not pile onto whichever worker last reported idle.
    const int64_t d_blocks = w.assigned_blocks - w.assigned_blocks_at_report;
    const int64_t d_streams = w.inflight - w.inflight_at_report;
    c.queued_prefill_tokens = static_cast<int64_t>(w.load.queued_prefill_tokens());
    c.active_kv_blocks =
        std::max<int64_t>(0, static_cast<int64_t>(w.load.active_kv_blocks()) + d_blocks);
    c.free_kv_blocks =
        std::max<int64_t>(0, static_cast<int64_t>(w.load.free_kv_blocks()) - d_blocks);
    c.total_kv_blocks = static_cast<int64_t>(w.load.total_kv_blocks());
    // Streams that ended since the report leave the running set first.
    const int64_t running = static_cast<int64_t>(w.load.num_running_requests());
    const int64_t waiting = static_cast<int64_t>(w.load.num_waiting_requests());
    const int64_t ended = std::min<int64_t>(std::max<int64_t>(0, -d_streams), running + waiting);
    c.running = static_cast<int32_t>(std::max<int64_t>(0, running - ended));
    c.waiting = static_cast<int32_t>(waiting - std::max<int64_t>(0, ended - running));
    c.inflight_assigned = std::max<int64_t>(0, d_streams);
    c.inflight_new_blocks = std::max<int64_t>(0, d_blocks);
  }
  std::vector<WorkerOverlap> overlaps;
  if (index_ != nullptr && !chain.empty()) {
    overlaps = index_->Match(chain);
  }
  if (tier_credit_ != nullptr && !chain.empty()) {
    std::vector<NodeWorker> nodes;
    nodes.reserve(workers.size());
    for (const WorkerSnapshot& w : workers) {
      if (w.healthy && !w.worker_id.empty() && !w.node_name.empty()) {
        nodes.push_back(NodeWorker{w.worker_id, w.node_name});
      }
    }
    tier_credit_->Extend(chain, nodes, &overlaps);
  }
  absl::StatusOr<RoutingDecision> d =
      scorer_->Choose(candidates, overlaps, prompt_tokens, block_size_);
  if (!d.ok()) {
    if (absl::IsUnavailable(d.status())) {
      return absl::UnavailableError(absl::StrCat("no healthy decode worker (", workers.size(),
                                                 " configured); retry later"));
    }
    return d.status();
  }
  Placement p;
  p.decode_index = workers[d->decode_index].index;
  p.prefill_index = d->prefill_index >= 0 ? workers[d->prefill_index].index : -1;
  p.reason = std::move(d->reason);
  p.prefill_reason = std::move(d->prefill_reason);
  p.cached_blocks = d->decode_overlap_blocks;
  p.new_blocks =
      std::max<int64_t>(0, (prompt_tokens + block_size_ - 1) / block_size_ - p.cached_blocks);
  return p;
}

absl::StatusOr<ScorerConfig> ScorerConfigFor(const RouterConfig& config) {
  ScorerConfig s;
  absl::StatusOr<ScorerPolicy> policy = ParsePolicy(config.policy);
  if (!policy.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--policy: ", policy.status().message()));
  }
  s.policy = *policy;
  s.prefill_weight = config.prefill_weight;
  s.dram_hit_weight = config.dram_hit_weight;
  s.nvme_hit_weight = config.nvme_hit_weight;
  s.remote_hit_weight = config.remote_hit_weight;
  s.decode_load_weight = config.decode_load_weight;
  s.inflight_weight = config.inflight_weight;
  s.inflight_blocks_weight = config.inflight_blocks_weight;
  s.backlog_prefill_weight = config.backlog_prefill_weight;
  s.min_hit_fraction = config.min_hit_fraction;
  s.disagg_threshold_tokens = config.disagg_threshold_tokens;
  if (absl::Status st = s.Validate(); !st.ok()) {
    // The scorer names its fields as the flags are named.
    return absl::InvalidArgumentError(absl::StrCat("pd-router flags: ", st.message()));
  }
  return s;
}

absl::StatusOr<std::unique_ptr<PlacementPolicy>> MakePlacementPolicy(const RouterConfig& config,
                                                                     const KvIndex* index,
                                                                     TierCredit* tier_credit) {
  PD_ASSIGN_OR_RETURN(ScorerConfig scorer_config, ScorerConfigFor(config));
  PD_ASSIGN_OR_RETURN(std::unique_ptr<WorkerScorer> scorer, WorkerScorer::Create(scorer_config));
  return std::make_unique<ScoredPlacementPolicy>(std::move(scorer), index, config.block_size,
                                                 tier_credit);
}

}  // namespace pd::router
