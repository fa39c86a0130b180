#include "loadtest/sim/remote_fetch.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"

namespace pd::loadtest::sim {

absl::Status RemoteFetchConfig::Validate() const {
  if (kv_bytes_per_token <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--kv_bytes_per_token must be > 0, got ", kv_bytes_per_token));
  }
  if (!(bandwidth_gbps > 0) || !std::isfinite(bandwidth_gbps)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--fetch_bandwidth_gbps must be finite and > 0, got ", bandwidth_gbps));
  }
  if (latency < absl::ZeroDuration() || latency == absl::InfiniteDuration()) {
    return absl::InvalidArgumentError(absl::StrCat("--fetch_latency must be finite and >= 0, got ",
                                                   absl::FormatDuration(latency)));
  }
  return absl::OkStatus();
}

double RemoteFetchConfig::BlockSeconds(int64_t block_size) const {
  const double bits = static_cast<double>(block_size) * static_cast<double>(kv_bytes_per_token) * 8;
  return bits / (bandwidth_gbps * 1e9);
}

RemoteFetcher::RemoteFetcher(const RemoteFetchConfig& config,
                             std::vector<const kvcache::KvCacheManager*> pools, int64_t block_size,
                             double prefill_tokens_per_s)
    : config_(config),
      pools_(std::move(pools)),
      block_size_(block_size),
      prefill_tokens_per_s_(prefill_tokens_per_s),
      link_free_ns_(pools_.size(), 0) {}

int64_t RemoteFetcher::FetchNs(int64_t blocks) const {
  return absl::ToInt64Nanoseconds(config_.latency) +
         static_cast<int64_t>(
             std::ceil(static_cast<double>(blocks) * config_.BlockSeconds(block_size_) * 1e9));
}

FetchPlan RemoteFetcher::Plan(int worker, absl::Span<const BlockHash> chain, int64_t local_blocks,
                              int64_t max_blocks, int64_t now_ns) {
  FetchPlan plan;
  const int64_t limit = std::min<int64_t>(max_blocks, static_cast<int64_t>(chain.size()));
  if (local_blocks >= limit) {
    return plan;
  }
  int64_t best = local_blocks;
  for (int h = 0; h < static_cast<int>(pools_.size()); ++h) {
    if (h == worker) {
      continue;
    }
    const int64_t held = std::min(pools_[h]->Match(chain), limit);
    if (held > best || (held == best && plan.holder >= 0 && held > local_blocks &&
                        link_free_ns_[h] < link_free_ns_[plan.holder])) {
      best = held;
      plan.holder = h;
    }
  }
  if (plan.holder < 0) {
    return plan;
  }
  plan.available_blocks = best - local_blocks;
  const int64_t start_ns = std::max(now_ns, link_free_ns_[plan.holder]);
  const int64_t end_ns = start_ns + FetchNs(plan.available_blocks);
  const double recompute_ns =
      static_cast<double>(plan.available_blocks * block_size_) / prefill_tokens_per_s_ * 1e9;
  if (static_cast<double>(end_ns - now_ns) >= recompute_ns) {
    return plan;  // recompute: the link (queue included) is slower than the worker
  }
  plan.blocks = plan.available_blocks;
  plan.wait_ns = start_ns - now_ns;
  plan.end_ns = end_ns;
  link_free_ns_[plan.holder] = end_ns;
  return plan;
}

}  // namespace pd::loadtest::sim
