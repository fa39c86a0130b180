// The router simulator behind pd-routesim (docs/loadtest.md, "Router simulator"): replays a
// Mooncake trace through the router's real placement code — KvIndex (services/router/
// kv_index.h) fed with KvEventBatch protos, and WorkerScorer (worker_scorer.h) — against N
// simulated workers (sim_worker.h), on a simulated clock, and reports the prefix hit ratio, the
// load balance and an estimated TTFT.
//
// What the simulated router does, per request at its arrival time:
//   1. the prompt's block-hash chain (below) is matched against the KvIndex;
//   2. WorkerScorer::Choose places it; the candidates are built as pd-router's placement.cc
//      builds them: the last load report of each worker, corrected by the streams this router
//      opened and closed since (inflight_assigned, active/free blocks);
//   3. the worker queues it for prefill (the decode worker prefills: every worker is a decode
//      worker and none is listed as a prefill worker, so placement is colocated);
//   4. with remote fetch (RouteSimConfig::remote, on by default; remote_fetch.h), when its
//      prefill starts the worker fetches the blocks after its own hit that another worker
//      holds, or recomputes them, whichever is faster then.
// Workers' KV events reach the index `event_delay` after they happen (one KvEventBatch per
// worker per state change); load reports are polled every `load_report_interval` and arrive
// `load_report_delay` later.
//
// Policies: cache_aware, round_robin (WorkerScorer), random (uniform, drawn from the seeded
// generator: WorkerScorer's own random policy cannot be seeded) and pooled: one KV pool of
// N × capacity blocks shared by all workers (an ideal shared cache tier, the upper bound of
// any routing), each request going to the worker with the least prefill work queued at that
// instant (exact, not stale). Its hits cost nothing, and it fetches nothing.
//
// Blocks. Trace hash ids name 512-token blocks (`trace_block_tokens`). A worker's block of
// `block_size` tokens (which must divide trace_block_tokens) is sub-block j of trace block i;
// its hash is a real chain hash, HashBlock(parent, {id_lo, id_hi, j}), so two prompts share a
// block exactly when they share every trace id up to it (Mooncake's ids are prefix-chained, so
// this is the same as sharing the id). Only full blocks are hashed, cached and matched (as in
// the engine), so a prompt's partial last block never hits.
//
// Deterministic: the same trace and config give the same result (the seed drives random
// placement and arrival jitter). Thread-compatible; RunRouteSim is a pure function of its
// arguments.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "loadtest/metrics.h"
#include "loadtest/sim/remote_fetch.h"
#include "loadtest/sim/sim_worker.h"
#include "loadtest/trace.h"
#include "services/router/kv_index.h"
#include "services/router/worker_scorer.h"

namespace pd::loadtest::sim {

enum class SimPolicy { kCacheAware, kRoundRobin, kRandom, kPooled };

// "cache_aware", "round_robin", "random", "pooled"; InvalidArgument otherwise.
absl::StatusOr<SimPolicy> ParseSimPolicy(absl::string_view name);
absl::string_view SimPolicyName(SimPolicy policy);

struct RouteSimConfig {
  SimPolicy policy = SimPolicy::kCacheAware;
  int num_workers = 8;               // [1, 1024]
  int64_t block_size = 512;          // tokens per KV block; divides trace_block_tokens
  int64_t trace_block_tokens = 512;  // tokens per trace hash id
  int64_t capacity_blocks = 20'000;  // KV pool of each worker, in blocks of block_size
  TimeModel time;
  absl::Duration load_report_interval = absl::Milliseconds(500);  // > 0 (pd-router's health)
  absl::Duration load_report_delay = absl::ZeroDuration();        // >= 0
  absl::Duration event_delay = absl::Milliseconds(10);            // >= 0
  int64_t index_max_blocks = 0;  // KvIndexConfig::max_blocks; 0 = pd-router's automatic bound
  // Weights of cache_aware (and disagg threshold); `policy` inside is ignored.
  router::ScorerConfig scorer;
  // The cluster-wide cache: fetches between workers' pools (not for pooled). enabled = false
  // is the simulator without it, outcome for outcome.
  RemoteFetchConfig remote;
  uint64_t seed = 0;
  // Each arrival is moved later by a uniform draw in [0, arrival_jitter) (the shared trace has
  // 3-second ticks); 0 = replay the timestamps as they are (bursts).
  absl::Duration arrival_jitter = absl::ZeroDuration();

  // InvalidArgument naming the flag.
  absl::Status Validate() const;
};

// One request's fate.
struct SimRequestOutcome {
  int worker = -1;  // -1 = rejected (needs more blocks than a worker's pool holds)
  int64_t prompt_tokens = 0;
  int64_t cached_tokens = 0;      // the worker's own hit
  int64_t fetched_tokens = 0;     // fetched from another worker
  int64_t fetch_ns = 0;           // the fetch, link queue included (part of ttft_ns)
  bool recompute_chosen = false;  // another worker held blocks; recomputing them was faster
  int64_t ttft_ns = -1;           // first token − arrival
  int64_t end_ns = -1;
};

struct SimWorkerResult {
  std::string worker_id;
  SimWorkerStats stats;
};

struct RouteSimResult {
  SimPolicy policy = SimPolicy::kCacheAware;
  int num_workers = 0;
  int64_t requests = 0;  // placed and completed
  int64_t rejected = 0;  // could never fit a worker's pool
  int64_t prompt_tokens = 0;
  int64_t cached_tokens = 0;  // the placed worker's own hits
  double hit_ratio = 0;       // cached_tokens / prompt_tokens: local hits only
  // Remote fetch: tokens fetched from other workers instead of computed, the requests that
  // fetched, their fetch time (link queue included) and the requests that recomputed blocks
  // another worker held because the fetch would have been slower. 0 without remote fetch.
  int64_t fetched_tokens = 0;
  int64_t fetched_blocks = 0;  // fetched_tokens in blocks of block_size
  int64_t fetches = 0;
  int64_t fetch_ns = 0;
  int64_t recompute_chosen = 0;
  // (cached_tokens + fetched_tokens) / prompt_tokens: tokens not computed, local + remote.
  double hit_ratio_with_remote = 0;
  // Mean fetch time over the requests that fetched, and the fetch time's share of all TTFT
  // (Σ fetch / Σ TTFT).
  double mean_fetch_ms = 0;
  double fetch_share_of_ttft = 0;
  // max / mean over the workers (idle ones count in the mean) of prefill_tokens and of
  // requests; 1 = perfectly even.
  double prefill_imbalance = 0;
  double request_imbalance = 0;
  LatencyStats ttft;          // ms
  LatencyStats prefill_wait;  // ms, arrival -> prefill start
  double simulated_s = 0;     // first arrival -> last request end
  std::vector<SimWorkerResult> workers;
  std::map<std::string, int64_t> reasons;  // RoutingDecision::reason -> requests
  // Placements on a worker holding fewer leading blocks of the prompt (per the index at that
  // moment) than another worker did, and the blocks given up that way (sum of max − chosen).
  // 0 for pooled.
  int64_t affinity_missed_requests = 0;
  int64_t affinity_missed_blocks = 0;
  // Means over the load-report ticks, across workers: active KV blocks per worker, and the
  // spread (max − min) of active blocks and of queued prefill work (in blocks). What the
  // scorer's load terms see, to set beside the blocks a cache hit saves.
  double mean_active_blocks = 0;
  double mean_active_blocks_spread = 0;
  double mean_queued_blocks_spread = 0;
  router::KvIndexStats index;     // at the end
  int64_t index_max_entries = 0;  // most entries seen at a load-report tick
  int64_t index_rejected_batches = 0;
  std::vector<SimRequestOutcome> outcomes;  // in trace order
};

// remote_hit_weight from the fetch model: one block's fetch time over its prefill time
// (kv_bytes_per_token · 8 / bandwidth against 1 / prefill_tokens_per_s), clamped to [0, 1]; 1
// when remote fetch is off. The per-fetch latency is left out (amortized over the blocks).
double RemoteHitWeightFromModel(const RouteSimConfig& config);

// Runs one simulation. InvalidArgument for a bad config.
absl::StatusOr<RouteSimResult> RunRouteSim(const Trace& trace, const RouteSimConfig& config);

// The hashes of a prompt's full blocks (see the file comment). `hash_ids` are the trace
// record's (after any cap), `prompt_tokens` its input length.
std::vector<BlockHash> TraceChain(absl::Span<const uint64_t> hash_ids, int64_t prompt_tokens,
                                  int64_t trace_block_tokens, int64_t block_size);

}  // namespace pd::loadtest::sim
