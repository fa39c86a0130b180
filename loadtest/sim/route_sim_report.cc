#include "loadtest/sim/route_sim_report.h"

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/time.h"

namespace pd::loadtest::sim {
namespace {

using nlohmann::ordered_json;

double Ms(absl::Duration d) { return absl::ToDoubleMilliseconds(d); }

void AddStats(ordered_json& j, const char* metric, const LatencyStats& s) {
  j[absl::StrCat("mean_", metric, "_ms")] = s.mean;
  j[absl::StrCat("median_", metric, "_ms")] = s.median;
  j[absl::StrCat("p90_", metric, "_ms")] = s.p90;
  j[absl::StrCat("p99_", metric, "_ms")] = s.p99;
}

ordered_json ConfigJson(const RouteSimRunInfo& info) {
  const RouteSimConfig& c = info.base;
  ordered_json j;
  j["trace"] = info.trace;
  j["trace_records"] = info.trace_records;
  j["trace_skipped_lines"] = info.trace_skipped_lines;
  j["trace_capped_requests"] = info.trace_capped_requests;
  j["time_scale"] = info.time_scale;
  j["max_input_len"] = info.max_input_len;
  j["trace_block_tokens"] = c.trace_block_tokens;
  j["block_size"] = c.block_size;
  j["capacity_blocks"] = c.capacity_blocks;
  j["prefill_tokens_per_s"] = c.time.prefill_tokens_per_s;
  j["prefill_overhead_ms"] = Ms(c.time.prefill_overhead);
  j["decode_step_ms"] = Ms(c.time.decode_step);
  j["decode_step_per_seq_ms"] = Ms(c.time.decode_step_per_seq);
  j["load_report_interval_ms"] = Ms(c.load_report_interval);
  j["load_report_delay_ms"] = Ms(c.load_report_delay);
  j["event_delay_ms"] = Ms(c.event_delay);
  j["index_max_blocks"] = c.index_max_blocks;
  j["prefill_weight"] = c.scorer.prefill_weight;
  j["decode_load_weight"] = c.scorer.decode_load_weight;
  j["inflight_weight"] = c.scorer.inflight_weight;
  j["inflight_blocks_weight"] = c.scorer.inflight_blocks_weight;
  j["backlog_prefill_weight"] = c.scorer.backlog_prefill_weight;
  j["min_hit_fraction"] = c.scorer.min_hit_fraction;
  j["remote_hit_weight"] = c.scorer.remote_hit_weight;
  j["remote_fetch"] = c.remote.enabled;
  j["kv_bytes_per_token"] = c.remote.kv_bytes_per_token;
  j["fetch_bandwidth_gbps"] = c.remote.bandwidth_gbps;
  j["fetch_latency_ms"] = Ms(c.remote.latency);
  j["seed"] = c.seed;
  j["arrival_jitter_ms"] = Ms(c.arrival_jitter);
  j["started_at"] = info.started_at;
  return j;
}

}  // namespace

double PooledHitRatio(const std::vector<RouteSimResult>& results, int num_workers) {
  for (const RouteSimResult& r : results) {
    if (r.policy == SimPolicy::kPooled && r.num_workers == num_workers) {
      return r.hit_ratio;
    }
  }
  return -1;
}

std::string RouteSimJson(const std::vector<RouteSimResult>& results, const RouteSimRunInfo& info) {
  ordered_json j;
  j["config"] = ConfigJson(info);
  ordered_json list = ordered_json::array();
  for (const RouteSimResult& r : results) {
    ordered_json o;
    o["policy"] = std::string(SimPolicyName(r.policy));
    o["num_workers"] = r.num_workers;
    o["requests"] = r.requests;
    o["rejected"] = r.rejected;
    o["prompt_tokens"] = r.prompt_tokens;
    o["cached_tokens"] = r.cached_tokens;
    o["hit_ratio"] = r.hit_ratio;
    o["hit_ratio_with_remote"] = r.hit_ratio_with_remote;
    const double pooled = PooledHitRatio(results, r.num_workers);
    o["hit_ratio_vs_pooled"] =
        pooled > 0 ? ordered_json(r.hit_ratio_with_remote / pooled) : ordered_json();
    o["fetched_tokens"] = r.fetched_tokens;
    o["fetched_blocks"] = r.fetched_blocks;
    o["fetches"] = r.fetches;
    o["mean_fetch_ms"] = r.mean_fetch_ms;
    o["fetch_share_of_ttft"] = r.fetch_share_of_ttft;
    o["recompute_chosen"] = r.recompute_chosen;
    o["prefill_imbalance"] = r.prefill_imbalance;
    o["request_imbalance"] = r.request_imbalance;
    AddStats(o, "ttft", r.ttft);
    AddStats(o, "prefill_wait", r.prefill_wait);
    o["simulated_s"] = r.simulated_s;
    ordered_json reasons = ordered_json::object();
    for (const auto& [reason, n] : r.reasons) {
      reasons[reason] = n;
    }
    o["reasons"] = reasons;
    o["affinity_missed_requests"] = r.affinity_missed_requests;
    o["affinity_missed_blocks"] = r.affinity_missed_blocks;
    o["mean_active_blocks"] = r.mean_active_blocks;
    o["mean_active_blocks_spread"] = r.mean_active_blocks_spread;
    o["mean_queued_blocks_spread"] = r.mean_queued_blocks_spread;
    if (r.policy != SimPolicy::kPooled) {
      ordered_json index;
      index["entries"] = r.index.entries;
      index["max_entries"] = r.index_max_entries;
      index["evictions"] = r.index.evictions;
      index["events_applied"] = r.index.events_applied;
      index["rejected_batches"] = r.index_rejected_batches;
      o["index"] = index;
    }
    ordered_json workers = ordered_json::array();
    for (const SimWorkerResult& w : r.workers) {
      ordered_json wj;
      wj["worker_id"] = w.worker_id;
      wj["requests"] = w.stats.requests;
      wj["prompt_tokens"] = w.stats.prompt_tokens;
      wj["cached_tokens"] = w.stats.cached_tokens;
      wj["prefill_tokens"] = w.stats.prefill_tokens;
      wj["fetched_tokens"] = w.stats.fetched_tokens;
      wj["fetches"] = w.stats.fetches;
      wj["recompute_chosen"] = w.stats.recompute_chosen;
      wj["prefill_busy_s"] = static_cast<double>(w.stats.prefill_busy_ns) / 1e9;
      wj["stored_blocks"] = w.stats.stored_blocks;
      wj["removed_blocks"] = w.stats.removed_blocks;
      workers.push_back(wj);
    }
    o["workers"] = workers;
    list.push_back(o);
  }
  j["results"] = list;
  return j.dump(2, ' ', false, ordered_json::error_handler_t::replace) + "\n";
}

std::string RouteSimTable(const std::vector<RouteSimResult>& results) {
  // hit_local: the worker's own cache; hit_l+r: own cache plus blocks fetched from other
  // workers (tokens not computed); vs_pooled compares the latter.
  constexpr char kRow[] = "%-7s %-12s %9s %9s %9s %11s %9s %11s %10s %10s %10s %8s %9s %9s %6s\n";
  std::string t = absl::StrFormat(kRow, "workers", "policy", "hit_local", "hit_l+r", "vs_pooled",
                                  "prefill_max", "req_max", "ttft_mean", "ttft_p50", "ttft_p99",
                                  "fetched", "fetch", "recompute", "rejected", "idle");
  absl::StrAppendFormat(&t, kRow, "", "", "(own)", "(+remote)", "(l+r)", "/mean", "/mean", "(ms)",
                        "(ms)", "(ms)", "(blocks)", "%ttft", "", "", "");
  int last_workers = -1;
  for (const RouteSimResult& r : results) {
    if (last_workers >= 0 && r.num_workers != last_workers) {
      t += "\n";
    }
    last_workers = r.num_workers;
    const double pooled = PooledHitRatio(results, r.num_workers);
    const std::string vs =
        pooled > 0 ? absl::StrFormat("%.4f", r.hit_ratio_with_remote / pooled) : "-";
    int idle = 0;  // workers that never prefilled a request
    for (const SimWorkerResult& w : r.workers) {
      idle += w.stats.requests == 0 ? 1 : 0;
    }
    absl::StrAppendFormat(
        &t,
        "%-7d %-12s %9.4f %9.4f %9s %11.3f %9.3f %11.1f %10.1f %10.1f %10d %7.1f%% %9d %9d %6d\n",
        r.num_workers, SimPolicyName(r.policy), r.hit_ratio, r.hit_ratio_with_remote, vs,
        r.prefill_imbalance, r.request_imbalance, r.ttft.mean, r.ttft.median, r.ttft.p99,
        r.fetched_blocks, 100 * r.fetch_share_of_ttft, r.recompute_chosen, r.rejected, idle);
  }
  return t;
}

}  // namespace pd::loadtest::sim
