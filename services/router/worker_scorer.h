// WorkerScorer: places one request, choosing its decode worker D and, unless the request is cheap
// to prefill on D, a separate prefill worker P (docs/architecture.md, "Router scoring" and
// "Conditional disaggregation").
// Three policies: cache_aware (the cost model below), and round_robin and random as the
// baselines the load tests compare it with.
//
// Cost model of cache_aware. Costs are in blocks of prefill work or KV memory. For a request of
// prompt_tokens tokens and block size S:
//   B            = ceil(prompt_tokens / S)    blocks the prompt occupies (the trailing partial
//                                             block included: it must be computed too)
//   h, r, n      = worker w's leading HBM, DRAM and NVMe blocks of the chain (KvIndex::Match),
//                  clamped so that h + r + n <= floor(prompt_tokens / S)
//   m(w)         = max(0, max{h + r + n of another healthy candidate} - (h + r + n)(w)):
//                  remote blocks, the leading blocks after w's own that another candidate
//                  holds (the longest other continuation), which w could fetch from that
//                  node instead of computing them (issue #19)
//   eff(w)       = h + (1 - dram_hit_weight)·r + (1 - nvme_hit_weight)·n
//                    + (1 - remote_hit_weight)·m(w)
//                  blocks of prefill work w's cache saves (a tier hit still costs its restore,
//                  a remote hit its fetch); remote_hit_weight = 1 (pd-router's default) gives
//                  no remote credit
//   pref(w)      = eff(w) when eff(w) >= min_hit_fraction · B, else 0: the hit placement
//                  prefers w for. A short hit (a system prompt every warm worker holds) still
//                  saves its blocks on whichever worker holds it, but does not attract requests,
//                  or the workers holding it would take everything at light load and the rest
//                  never warm up.
//   backlog(w)   = [local(w)] · (queued_prefill_tokens(w) / S
//                                + inflight_blocks_weight · inflight_new_blocks(w))
//                  + inflight_weight · inflight_assigned(w)
//                  prefill work queued on w, in blocks: its last report plus the requests sent
//                  since (charged an average prompt each, and, with inflight_blocks_weight, the
//                  new blocks the router knows they bring)
//   kv(w)        = active_kv_blocks(w) + B - h(w) when pref(w) > 0, else active_kv_blocks(w) + B
//                  KV blocks w would reference (a short hit does not attract through this term
//                  either)
//   occ(w)       = min(1, kv(w) / total_kv_blocks(w)); 1 before the first report
// Decode worker: each healthy can_decode candidate d is scored
//   score(d) = alpha · (B - pref(d))                                 work the request still needs
//            + backlog(d)                                            work queued before it
//            + decode_load_weight · kv(d) · occ(d)                   KV pressure
//   alpha    = prefill_weight + backlog_prefill_weight · remote_hit_weight
//                               · mean{backlog(d') : pref(d') < max pref}
//              (the mean is 0 when no candidate holds less than the others)
// KV memory counts in proportion to how full the pool is: a pool at 1% costs nothing worth a
// cache miss, a nearly full one evicts or preempts. alpha prices recomputation by how busy the
// workers are that would do it: a prefix moved away from its holder is computed again on a
// worker that is itself busy, which delays everything queued there, while an idle one absorbs
// it (so a hot prefix whose holders are loaded still spills over to idle workers: holders do
// not count in the mean). Without backlog, alpha = prefill_weight and, KV pressure aside,
// score(d) is the time to the first token in blocks. The backlog term protects affinity because
// a request moved off its holder loses the cache; where the others can fetch the prefix, it
// loses only the fetch, so the term shrinks with remote_hit_weight (unchanged at 1, no remote
// credit). Found in pd-routesim (docs/benchmarks.md, "Router simulator with remote fetch"): with
// the full term the scorer kept requests on busy holders to save a fetch worth a few blocks.
// Remote credit: with remote_hit_weight < 1 every worker that could fetch the holder's blocks
// gets pref ~ (1 - remote_hit_weight)·eff(holder), so the holder's advantage shrinks from
// alpha·eff(holder) to about alpha·remote_hit_weight·m, the price of the fetch: a holder whose
// backlog exceeds that loses the request to a less busy worker that fetches, while an idle
// holder still wins (it saves the fetch). m(w) is never longer than the holder's overlap, so a
// short hit (block 0 everyone holds) gives a short remote credit that min_hit_fraction keeps
// from attracting, as it does the hit itself.
// local(d) holds when d would prefill the request itself: no healthy can_prefill worker other
// than d, or fewer than disagg_threshold_tokens uncached tokens on d
// (prompt_tokens - (h + r + n)·S). d's own overlap always counts, whether or not it prefills:
// what d holds is neither recomputed by P nor transferred (P skips D's cached blocks), and its
// HBM hits are shared, so they add no KV blocks (the B - h(d) of kv(d)).
// D = the candidate with the smallest (does not fit, score, requests, rotation), where "does not
// fit" is free_kv_blocks < B - h(d) on a worker that reports total_kv_blocks > 0, requests =
// running + waiting + inflight_assigned, and rotation starts at a cursor that advances on every
// call, so that requests with equal scores (e.g. distinct prefixes on an idle cluster) spread
// evenly. Scores within 1e-9 relative count as equal.
// Prefill worker, unless local(D): among healthy can_prefill candidates p != D, the smallest
// (score, requests, rotation) with
//   score(p) = prefill_weight · (B - max(eff(p), eff(D))) + queued_prefill_tokens(p) / S
//            + inflight_weight · inflight_assigned(p)
// (P reuses its own cache and skips the blocks D already holds).
//
// round_robin / random: D is the next (a uniformly random) healthy can_decode candidate; P the
// next (a random) healthy can_prefill candidate other than D; local(D) as above, so the
// disaggregation threshold applies to every policy.
//
// Thread-safety: thread-safe; Choose may run concurrently from many threads.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/random/random.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "services/router/kv_index.h"

namespace pd::router {

enum class ScorerPolicy { kCacheAware, kRoundRobin, kRandom };

// "cache_aware", "round_robin" or "random". InvalidArgument listing the valid names otherwise.
absl::StatusOr<ScorerPolicy> ParsePolicy(absl::string_view name);
// Inverse of ParsePolicy.
absl::string_view PolicyName(ScorerPolicy policy);

// Weights of the cost model (see the file comment); each maps 1:1 to a pd-router flag.
struct ScorerConfig {
  ScorerPolicy policy = ScorerPolicy::kCacheAware;

  // Cost of prefilling one uncached block, in the same unit as one KV block of decode load.
  // >= 0.
  double prefill_weight = 1.0;

  // Fraction of a block's prefill cost still paid when the block is restored from the node's
  // DRAM tier instead of computed. In [0, 1].
  double dram_hit_weight = 0.1;

  // Same for a block restored from the NVMe tier. In [0, 1].
  double nvme_hit_weight = 0.3;

  // Same for a block fetched from another node (one that another candidate holds beyond this
  // worker's own overlap: m(w) in the file comment): about fetch time / prefill time per block.
  // In [0, 1]; 1 = no credit for remote blocks, the default while workers cannot fetch from
  // other nodes (issue #19 item 1).
  double remote_hit_weight = 1.0;

  // Weight of decode load (KV blocks referenced on the worker, plus this request's new ones,
  // scaled by how full its pool is) against prefill work. >= 0.
  double decode_load_weight = 1.0;

  // Blocks of prefill backlog charged per request the router has placed on a worker and not
  // yet seen finish (WorkerCandidate::inflight_assigned); about an average prompt's blocks.
  // Makes placement load-aware between load reports. >= 0.
  double inflight_weight = 8.0;

  // Weight of the new prompt blocks the router has placed on a worker since its last load
  // report (WorkerCandidate::inflight_new_blocks), added to its prefill backlog: the exact
  // size of what the report cannot count yet, where inflight_weight charges an average. 0 =
  // not counted (the default until pd-router's load tests confirm the simulator). >= 0.
  double inflight_blocks_weight = 0.0;

  // Added to prefill_weight per block of mean backlog on the workers that hold less of the
  // prompt than the best, times remote_hit_weight (alpha in the file comment). 0 = a cache miss
  // always costs prefill_weight per block. >= 0.
  double backlog_prefill_weight = 4.0;

  // A worker's hit attracts the request only when it covers at least this fraction of the
  // prompt's blocks (pref in the file comment). 0 = every hit attracts. In [0, 1].
  double min_hit_fraction = 0.2;

  // When the chosen decode worker would have to compute fewer than this many prompt tokens
  // (after its cache hits), it prefills locally and no prefill worker is used. 0 = always use
  // a prefill worker when one exists. >= 0.
  int64_t disagg_threshold_tokens = 256;

  // InvalidArgument naming the field when a weight is negative or not finite, a hit weight or
  // min_hit_fraction is above 1, or disagg_threshold_tokens is negative.
  absl::Status Validate() const;
};

// One worker as the router sees it when placing a request. Negative counts are read as 0.
struct WorkerCandidate {
  std::string worker_id;  // matches WorkerOverlap::worker_id; empty = unknown (no overlap)
  std::string address;    // gRPC address; informational here
  bool healthy = false;
  bool can_prefill = false;
  bool can_decode = false;
  int64_t queued_prefill_tokens = 0;  // from its last WorkerLoad
  int64_t active_kv_blocks = 0;       // from its last WorkerLoad
  int64_t free_kv_blocks = 0;         // from its last WorkerLoad
  int64_t total_kv_blocks = 0;        // from its last WorkerLoad; 0 = no report yet
  int32_t running = 0;                // from its last WorkerLoad
  int32_t waiting = 0;                // from its last WorkerLoad
  int64_t inflight_assigned = 0;      // requests this router placed there since the last load
                                      // report (the report may not count them yet)
  int64_t inflight_new_blocks = 0;    // their new prompt blocks (Placement::new_blocks), less
                                      // those of streams that ended since the report
};

// Where one request runs.
struct RoutingDecision {
  int decode_index = -1;   // index into the candidates
  int prefill_index = -1;  // index into the candidates; -1 = the decode worker prefills locally
  // Leading prompt blocks the decode worker holds in any tier (h + r + n of the cost model).
  int64_t decode_overlap_blocks = 0;
  // The same for the prefill worker; 0 when prefill_index is -1.
  int64_t prefill_overlap_blocks = 0;
  // Why this decode worker (a metrics label): "cache_hit" (cache_aware, and it holds the most
  // blocks of the chain, more than some other candidate), "load" (cache_aware otherwise),
  // "round_robin", "random".
  std::string reason;
  // Why this prefill placement: "remote_prefill" (prefill_index set), "below_disagg_threshold"
  // or "no_prefill_worker" (no healthy can_prefill worker other than the decode worker).
  std::string prefill_reason;
};

class WorkerScorer {
 public:
  // InvalidArgument when `config` is invalid.
  static absl::StatusOr<std::unique_ptr<WorkerScorer>> Create(ScorerConfig config);

  WorkerScorer(const WorkerScorer&) = delete;
  WorkerScorer& operator=(const WorkerScorer&) = delete;

  // Places a request of `prompt_tokens` tokens (block size `block_size`) whose chain overlaps
  // are `overlaps` (KvIndex::Match of the prompt's chain; entries naming no candidate are
  // ignored, round_robin and random use them only for the disaggregation threshold).
  // Errors: InvalidArgument when prompt_tokens or block_size is not positive; Unavailable when
  // no candidate is healthy and can_decode.
  absl::StatusOr<RoutingDecision> Choose(absl::Span<const WorkerCandidate> candidates,
                                         absl::Span<const WorkerOverlap> overlaps,
                                         int64_t prompt_tokens, int64_t block_size);

  const ScorerConfig& config() const { return config_; }

 private:
  explicit WorkerScorer(ScorerConfig config) : config_(std::move(config)) {}

  const ScorerConfig config_;
  // Rotation cursors; relaxed: they only spread choices, no other memory depends on them.
  std::atomic<uint64_t> decode_cursor_{0};
  std::atomic<uint64_t> prefill_cursor_{0};
  absl::Mutex rng_mu_;
  absl::BitGen rng_ ABSL_GUARDED_BY(rng_mu_);
};

}  // namespace pd::router
