// pd-routesim: replays a Mooncake trace through pd-router's KvIndex and WorkerScorer against
// simulated workers, for each policy and worker count, and prints the prefix hit ratio, load
// balance and estimated TTFT (docs/loadtest.md, "Router simulator").
//
// Exit status: 0 after the simulations; 1 for a bad flag, a bad trace or an unwritable report.
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/time/clock.h"
#include "common/log/log.h"
#include "loadtest/cli_args.h"
#include "loadtest/report.h"
#include "loadtest/sim/route_sim.h"
#include "loadtest/sim/route_sim_report.h"
#include "services/base/startup.h"

ABSL_FLAG(std::string, trace, "", "Mooncake-format JSONL trace (required)");
ABSL_FLAG(int64_t, trace_block_tokens, 512, "tokens per trace hash id");
ABSL_FLAG(double, time_scale, 1.0, "timestamp multiplier (0.5 = twice the arrival rate)");
ABSL_FLAG(int64_t, max_input_len, 0, "cap prompts at this many tokens; 0 = no cap");
ABSL_FLAG(std::string, on_bad_line, "abort", "malformed trace line -> abort | skip");
ABSL_FLAG(int64_t, num_requests, 0, "replay only the first N records; 0 = all");
ABSL_FLAG(std::string, workers, "8,16,32,64", "worker counts to simulate, comma-separated");
ABSL_FLAG(std::string, policies, "cache_aware,round_robin,random,pooled",
          "policies: cache_aware, round_robin, random, pooled");
ABSL_FLAG(int64_t, block_size, 512, "tokens per KV block (divides --trace_block_tokens)");
ABSL_FLAG(int64_t, capacity_blocks, 20000, "KV pool of each worker, in blocks of --block_size");
ABSL_FLAG(double, prefill_tokens_per_s, 8000, "prefill speed of a worker (uncached tokens/s)");
ABSL_FLAG(absl::Duration, prefill_overhead, absl::Milliseconds(20), "fixed cost per prefill");
ABSL_FLAG(absl::Duration, decode_step, absl::Milliseconds(30), "decode step time at batch 1");
ABSL_FLAG(absl::Duration, decode_step_per_seq, absl::Microseconds(300),
          "decode step time added per sequence in the batch");
ABSL_FLAG(absl::Duration, load_report_interval, absl::Milliseconds(500),
          "the router polls worker load this often (pd-router --health_interval)");
ABSL_FLAG(absl::Duration, load_report_delay, absl::ZeroDuration(),
          "a load report reaches the router this long after it is taken");
ABSL_FLAG(absl::Duration, event_delay, absl::Milliseconds(10),
          "a KV event reaches the router's index this long after it happens");
ABSL_FLAG(int64_t, index_max_blocks, 0,
          "KvIndex entry bound (pd-router flag); 0 = pd-router's automatic bound for these "
          "workers' pools");
ABSL_FLAG(double, prefill_weight, 1.0, "cache_aware: pd-router --prefill_weight");
ABSL_FLAG(double, decode_load_weight, 1.0, "cache_aware: pd-router --decode_load_weight");
ABSL_FLAG(double, inflight_weight, 8.0, "cache_aware: pd-router --inflight_weight");
ABSL_FLAG(double, inflight_blocks_weight, -1,
          "cache_aware: pd-router --inflight_blocks_weight (the new prompt blocks placed on a "
          "worker since its last report, added to its backlog); negative (the default) = 1 with "
          "--remote_fetch (with fetches placement is mostly load balancing, and the trace's "
          "3-second bursts need the real size of what was just placed), 0 (pd-router's "
          "default) without");
ABSL_FLAG(double, backlog_prefill_weight, 4.0,
          "cache_aware: added to the prefill weight per block of backlog on the other workers");
ABSL_FLAG(double, min_hit_fraction, 0.2,
          "cache_aware: a hit attracts a request only when it covers this fraction of the prompt");
ABSL_FLAG(double, remote_hit_weight, -1,
          "cache_aware: pd-router --remote_hit_weight (fraction of a block's prefill cost paid "
          "to fetch it from another worker, [0, 1]); negative (the default) = derived from the "
          "fetch model: a block's fetch time over its prefill time with --remote_fetch (0.084 "
          "at the defaults), 1 (no credit) without");
ABSL_FLAG(bool, remote_fetch, true,
          "a worker's prefill may fetch the blocks after its own hit that another worker holds, "
          "when that is faster than computing them (issue #19's cluster-wide cache); false = "
          "the simulator without it, outcome for outcome");
ABSL_FLAG(int64_t, kv_bytes_per_token, 32768,
          "KV bytes of one token, for fetch times. Default: Llama-3.2-1B in bf16, 16 layers x 8 "
          "KV heads x 64 dims x 2 (K, V) x 2 bytes; a 70B (80 layers, GQA 8 x 128) is 327680");
ABSL_FLAG(double, fetch_bandwidth_gbps, 25,
          "bandwidth of each worker's outgoing KV link, gigabits/s (25 = a common datacenter "
          "NIC; fetches from one holder queue on its link)");
ABSL_FLAG(absl::Duration, fetch_latency, absl::Milliseconds(1),
          "fixed cost of one fetch (lookup, connection, completion), added to bytes / bandwidth");
ABSL_FLAG(uint64_t, seed, 0, "seed of random placement and arrival jitter");
ABSL_FLAG(absl::Duration, arrival_jitter, absl::ZeroDuration(),
          "delay each arrival by a uniform draw in [0, this); 0 = replay bursts as they are");
ABSL_FLAG(std::string, output_json, "", "write the JSON report here");

namespace {

using pd::loadtest::sim::RouteSimConfig;
using pd::loadtest::sim::RouteSimResult;
using pd::loadtest::sim::RouteSimRunInfo;
using pd::loadtest::sim::SimPolicy;

constexpr char kProgram[] = "pd-routesim";

template <typename T>
T OrExit(absl::StatusOr<T> v) {
  if (!v.ok()) {
    pd::services::ExitWithStartupError(kProgram, v.status());
  }
  return *std::move(v);
}

RouteSimConfig BaseConfigFromFlags() {
  RouteSimConfig c;
  c.block_size = absl::GetFlag(FLAGS_block_size);
  c.trace_block_tokens = absl::GetFlag(FLAGS_trace_block_tokens);
  c.capacity_blocks = absl::GetFlag(FLAGS_capacity_blocks);
  c.time.prefill_tokens_per_s = absl::GetFlag(FLAGS_prefill_tokens_per_s);
  c.time.prefill_overhead = absl::GetFlag(FLAGS_prefill_overhead);
  c.time.decode_step = absl::GetFlag(FLAGS_decode_step);
  c.time.decode_step_per_seq = absl::GetFlag(FLAGS_decode_step_per_seq);
  c.load_report_interval = absl::GetFlag(FLAGS_load_report_interval);
  c.load_report_delay = absl::GetFlag(FLAGS_load_report_delay);
  c.event_delay = absl::GetFlag(FLAGS_event_delay);
  c.index_max_blocks = absl::GetFlag(FLAGS_index_max_blocks);
  c.scorer.prefill_weight = absl::GetFlag(FLAGS_prefill_weight);
  c.scorer.decode_load_weight = absl::GetFlag(FLAGS_decode_load_weight);
  c.scorer.inflight_weight = absl::GetFlag(FLAGS_inflight_weight);
  c.scorer.backlog_prefill_weight = absl::GetFlag(FLAGS_backlog_prefill_weight);
  c.scorer.min_hit_fraction = absl::GetFlag(FLAGS_min_hit_fraction);
  c.remote.enabled = absl::GetFlag(FLAGS_remote_fetch);
  c.remote.kv_bytes_per_token = absl::GetFlag(FLAGS_kv_bytes_per_token);
  c.remote.bandwidth_gbps = absl::GetFlag(FLAGS_fetch_bandwidth_gbps);
  c.remote.latency = absl::GetFlag(FLAGS_fetch_latency);
  // The scorer credits remote blocks at what the simulated fetch costs, unless told otherwise.
  const double inflight_blocks_weight = absl::GetFlag(FLAGS_inflight_blocks_weight);
  c.scorer.inflight_blocks_weight =
      inflight_blocks_weight < 0 ? (c.remote.enabled ? 1.0 : 0.0) : inflight_blocks_weight;
  const double remote_hit_weight = absl::GetFlag(FLAGS_remote_hit_weight);
  c.scorer.remote_hit_weight =
      remote_hit_weight < 0 ? pd::loadtest::sim::RemoteHitWeightFromModel(c) : remote_hit_weight;
  c.seed = absl::GetFlag(FLAGS_seed);
  c.arrival_jitter = absl::GetFlag(FLAGS_arrival_jitter);
  return c;
}

}  // namespace

int main(int argc, char** argv) {
  pd::services::ParseDashedFlagsAndInitLogging(
      argc, argv,
      "pd-routesim --trace=FILE [--workers=8,16,32,64] [--policies=...] [--capacity_blocks=N] "
      "... (see docs/loadtest.md, \"Router simulator\")");
  if (absl::GetFlag(FLAGS_trace).empty()) {
    pd::services::ExitWithStartupError(kProgram, absl::InvalidArgumentError("--trace is required"));
  }
  const std::vector<int64_t> worker_counts =
      OrExit(pd::loadtest::ParseIntList("workers", absl::GetFlag(FLAGS_workers)));
  std::vector<SimPolicy> policies;
  for (const std::string& name :
       OrExit(pd::loadtest::ParseNameList("policies", absl::GetFlag(FLAGS_policies)))) {
    policies.push_back(OrExit(pd::loadtest::sim::ParseSimPolicy(name)));
  }
  RouteSimRunInfo info;
  info.base = BaseConfigFromFlags();
  info.trace = absl::GetFlag(FLAGS_trace);
  info.time_scale = absl::GetFlag(FLAGS_time_scale);
  info.max_input_len = absl::GetFlag(FLAGS_max_input_len);
  pd::loadtest::TraceOptions topts;
  topts.time_scale = info.time_scale;
  topts.max_input_len = info.max_input_len;
  topts.block_tokens = info.base.trace_block_tokens;
  topts.on_bad_line = OrExit(pd::loadtest::ParseBadLinePolicy(absl::GetFlag(FLAGS_on_bad_line)));
  pd::loadtest::Trace trace = OrExit(pd::loadtest::LoadTrace(info.trace, topts));
  const int64_t limit = absl::GetFlag(FLAGS_num_requests);
  if (limit > 0 && static_cast<size_t>(limit) < trace.records.size()) {
    trace.records.resize(static_cast<size_t>(limit));
  }
  info.trace_records = static_cast<int64_t>(trace.records.size());
  info.trace_skipped_lines = static_cast<int64_t>(trace.skipped.size());
  info.trace_capped_requests = trace.num_capped;
  info.started_at = absl::FormatTime(absl::RFC3339_sec, absl::Now(), absl::UTCTimeZone());

  std::vector<RouteSimResult> results;
  for (int64_t n : worker_counts) {
    for (SimPolicy policy : policies) {
      RouteSimConfig c = info.base;
      c.num_workers = static_cast<int>(std::clamp<int64_t>(n, -1, 1 << 20));
      c.policy = policy;
      const absl::Time start = absl::Now();
      results.push_back(OrExit(pd::loadtest::sim::RunRouteSim(trace, c)));
      LOG(INFO) << "pd-routesim: " << pd::loadtest::sim::SimPolicyName(policy) << " x " << n
                << " workers: " << absl::FormatDuration(absl::Now() - start);
    }
  }
  std::fputs(pd::loadtest::sim::RouteSimTable(results).c_str(), stdout);
  const std::string json_path = absl::GetFlag(FLAGS_output_json);
  if (!json_path.empty()) {
    if (absl::Status s =
            pd::loadtest::WriteFile(json_path, pd::loadtest::sim::RouteSimJson(results, info));
        !s.ok()) {
      pd::services::ExitWithStartupError(kProgram, s);
    }
  }
  return 0;
}
