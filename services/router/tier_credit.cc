#include "services/router/tier_credit.h"

#include <algorithm>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/log/log.h"

namespace pd::router {

// ---- RedisTierLookup ----------------------------------------------------------------------------

absl::StatusOr<std::unique_ptr<RedisTierLookup>> RedisTierLookup::Create(redis::RedisConfig redis,
                                                                         absl::Duration timeout,
                                                                         int num_connections) {
  if (num_connections < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("redis tier lookup needs >= 1 connection, got ", num_connections));
  }
  redis.connect_timeout = timeout;
  redis.command_timeout = timeout;
  // One attempt per call, no backoff sleep: a lookup is worth at most `timeout`.
  redis.max_reconnect_attempts = 0;
  PD_RETURN_IF_ERROR(redis.Validate());
  return std::unique_ptr<RedisTierLookup>(new RedisTierLookup(std::move(redis), num_connections));
}

RedisTierLookup::RedisTierLookup(redis::RedisConfig config, int num_connections)
    : config_(std::move(config)) {
  for (int i = 0; i < num_connections; ++i) {
    slots_.push_back(std::make_unique<Slot>());
  }
}

absl::StatusOr<std::vector<std::vector<redis::PrefixTier>>> RedisTierLookup::Lookup(
    absl::Span<const redis::PrefixQuery> queries) {
  for (const std::unique_ptr<Slot>& slot : slots_) {
    if (!slot->mu.TryLock()) {
      continue;
    }
    absl::StatusOr<std::vector<std::vector<redis::PrefixTier>>> result;
    if (slot->client == nullptr) {
      absl::StatusOr<std::unique_ptr<redis::RedisClient>> client =
          redis::RedisClient::Connect(config_);
      if (client.ok()) {
        slot->client = *std::move(client);
      } else {
        result = client.status();
      }
    }
    if (slot->client != nullptr) {
      result = redis::LookupPrefixTiersBatch(*slot->client, queries, &garbage_);
    }
    slot->mu.Unlock();
    return result;
  }
  return absl::ResourceExhaustedError(
      absl::StrCat("all ", slots_.size(), " redis tier lookup connections are busy"));
}

// ---- TierCredit ---------------------------------------------------------------------------------

absl::Status TierCreditConfig::Validate() const {
  if (breaker_open <= absl::ZeroDuration() || breaker_open == absl::InfiniteDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("TierCreditConfig.breaker_open must be finite and > 0, got ",
                     absl::FormatDuration(breaker_open)));
  }
  if (max_blocks < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("TierCreditConfig.max_blocks must be >= 1, got ", max_blocks));
  }
  return absl::OkStatus();
}

bool MergeTierContinuation(const std::string& worker_id, int64_t start,
                           absl::Span<const redis::PrefixTier> tiers,
                           std::vector<WorkerOverlap>* overlaps) {
  const auto dram =
      static_cast<int64_t>(std::count(tiers.begin(), tiers.end(), redis::PrefixTier::kDram));
  const auto nvme = static_cast<int64_t>(tiers.size()) - dram;
  auto it = std::find_if(overlaps->begin(), overlaps->end(),
                         [&](const WorkerOverlap& o) { return o.worker_id == worker_id; });
  if (it == overlaps->end()) {
    if (tiers.empty()) {
      return false;
    }
    WorkerOverlap o;
    o.worker_id = worker_id;
    o.hbm_blocks = start;
    o.dram_blocks = dram;
    o.nvme_blocks = nvme;
    overlaps->push_back(std::move(o));
    return true;
  }
  if (static_cast<int64_t>(tiers.size()) <= it->dram_blocks + it->nvme_blocks) {
    return false;
  }
  it->dram_blocks = dram;
  it->nvme_blocks = nvme;
  return true;
}

absl::StatusOr<std::unique_ptr<TierCredit>> TierCredit::Create(std::unique_ptr<TierLookup> lookup,
                                                               TierCreditConfig config,
                                                               Clock* clock) {
  PD_RETURN_IF_ERROR(config.Validate());
  if (lookup == nullptr || clock == nullptr) {
    return absl::InvalidArgumentError("tier credit needs a lookup and a clock");
  }
  return std::unique_ptr<TierCredit>(new TierCredit(std::move(lookup), config, clock));
}

TierCredit::TierCredit(std::unique_ptr<TierLookup> lookup, TierCreditConfig config, Clock* clock)
    : lookup_(std::move(lookup)), config_(config), clock_(clock) {}

void TierCredit::Extend(absl::Span<const BlockHash> chain, absl::Span<const NodeWorker> workers,
                        std::vector<WorkerOverlap>* overlaps) {
  if (chain.empty() || workers.empty()) {
    return;
  }
  {
    absl::MutexLock lock(&mu_);
    if (clock_->Now() < open_until_) {
      ++stats_.skipped_total;
      return;
    }
  }
  // One question per distinct (node, HBM hits): workers of one node share it.
  std::vector<redis::PrefixQuery> queries;
  absl::flat_hash_map<std::pair<std::string, int64_t>, size_t> query_of;
  std::vector<std::pair<size_t, int64_t>> asked(workers.size(), {SIZE_MAX, 0});
  for (size_t i = 0; i < workers.size(); ++i) {
    const NodeWorker& w = workers[i];
    if (w.worker_id.empty() || !redis::ValidatePrefixNodeName(w.node).ok()) {
      continue;
    }
    int64_t hbm = 0;
    for (const WorkerOverlap& o : *overlaps) {
      if (o.worker_id == w.worker_id) {
        hbm = o.hbm_blocks;
        break;
      }
    }
    if (hbm < 0 || hbm >= static_cast<int64_t>(chain.size())) {
      continue;
    }
    auto [it, inserted] = query_of.try_emplace(std::make_pair(w.node, hbm), queries.size());
    if (inserted) {
      queries.push_back(redis::PrefixQuery{
          w.node,
          chain.subspan(static_cast<size_t>(hbm), static_cast<size_t>(config_.max_blocks))});
    }
    asked[i] = {it->second, hbm};
  }
  if (queries.empty()) {
    return;
  }
  absl::StatusOr<std::vector<std::vector<redis::PrefixTier>>> tiers = lookup_->Lookup(queries);
  absl::MutexLock lock(&mu_);
  ++stats_.lookups_total;
  if (!tiers.ok()) {
    if (absl::IsResourceExhausted(tiers.status())) {
      // Every connection busy: this request goes without credit; Redis itself is fine.
      ++stats_.skipped_total;
      return;
    }
    ++stats_.errors_total;
    if (!failing_) {
      LOG(WARNING) << "router: redis tier lookup failed, placing without lower-tier credit for "
                   << absl::FormatDuration(config_.breaker_open)
                   << " at a time until it answers again: " << tiers.status();
    }
    failing_ = true;
    open_until_ = clock_->Now() + config_.breaker_open;
    return;
  }
  if (failing_) {
    LOG(INFO) << "router: redis tier lookups answer again; lower-tier credit restored";
    failing_ = false;
  }
  for (size_t i = 0; i < workers.size(); ++i) {
    const auto [q, hbm] = asked[i];
    if (q == SIZE_MAX || q >= tiers->size()) {
      continue;
    }
    const std::vector<redis::PrefixTier>& t = (*tiers)[q];
    if (MergeTierContinuation(workers[i].worker_id, hbm, t, overlaps)) {
      ++stats_.credited_workers_total;
      const auto dram =
          static_cast<uint64_t>(std::count(t.begin(), t.end(), redis::PrefixTier::kDram));
      stats_.dram_blocks_total += dram;
      stats_.nvme_blocks_total += t.size() - dram;
    }
  }
}

TierCreditStats TierCredit::Stats() const {
  absl::MutexLock lock(&mu_);
  TierCreditStats stats = stats_;
  stats.breaker_open = clock_->Now() < open_until_;
  return stats;
}

}  // namespace pd::router
