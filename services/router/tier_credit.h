// TierCredit: extends the router's per-worker chain overlaps with the lower-tier blocks the
// worker's node holds according to the Redis prefix index (issue #6 item 4: "the router credits
// lower-tier hits when scoring"; docs/architecture.md, "Router scoring").
//
// KvIndex::Match gives each worker's HBM hits h (from its KV events) and whatever DRAM/NVMe
// continuation (r, n) the worker reported itself. pd-tierd publishes what its node's DRAM and
// NVMe tiers hold into Redis (common/redis/prefix_index.h); Extend asks Redis, in one pipelined
// round trip, what each candidate's node holds of the chain right after the worker's HBM hits,
// and where that continuation is longer than (r, n) it replaces them, so the scorer credits it
// at dram_hit_weight / nvme_hit_weight.
//
// Redis is a hint, never a dependency of serving: a failed or slow lookup (the lookup client's
// timeout, 5 ms by default) leaves the overlaps as KvIndex gave them and opens a circuit
// breaker: no lookup is attempted for `breaker_open` after a failure, then the next request
// tries again. Extend never fails.
//
// Thread-safety: thread-safe; Extend runs concurrently from the placement threads. Lookups run
// on the calling thread.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/hash/block_hash.h"
#include "common/redis/prefix_index.h"
#include "common/redis/redis_client.h"
#include "common/time/clock.h"
#include "services/router/kv_index.h"

namespace pd::router {

// Where lower-tier continuations come from: Redis in production, a fake in tests.
class TierLookup {
 public:
  virtual ~TierLookup() = default;
  // Result i answers queries[i] (redis::LookupPrefixTiersBatch semantics). Called concurrently.
  virtual absl::StatusOr<std::vector<std::vector<redis::PrefixTier>>> Lookup(
      absl::Span<const redis::PrefixQuery> queries) = 0;
};

// TierLookup over a few dedicated Redis connections with tight timeouts (never the router's
// main client: a lookup must not wait behind, or retry like, other calls). A lookup takes a
// free connection (TryLock) or, when all are busy, fails at once with Unavailable, so
// placement never queues behind Redis. A connection is opened on first use and re-opened by the
// next call after a failure (one attempt, no backoff). Thread-safe.
class RedisTierLookup final : public TierLookup {
 public:
  // `redis` is the cluster's config (address, AUTH, key prefix); `timeout` bounds the connect
  // and each socket read/write of a lookup; `num_connections` >= 1. Connects lazily: never
  // fails because Redis is down. Errors: InvalidArgument (config).
  static absl::StatusOr<std::unique_ptr<RedisTierLookup>> Create(redis::RedisConfig redis,
                                                                 absl::Duration timeout,
                                                                 int num_connections = 4);

  absl::StatusOr<std::vector<std::vector<redis::PrefixTier>>> Lookup(
      absl::Span<const redis::PrefixQuery> queries) override;

  // Entries found that pdserve never writes (pd_router_redis_garbage_total).
  const redis::PrefixGarbageCounter& garbage() const { return garbage_; }

 private:
  struct Slot {
    absl::Mutex mu;
    std::unique_ptr<redis::RedisClient> client ABSL_GUARDED_BY(mu);
  };
  RedisTierLookup(redis::RedisConfig config, int num_connections);

  const redis::RedisConfig config_;
  std::vector<std::unique_ptr<Slot>> slots_;
  redis::PrefixGarbageCounter garbage_;
};

struct TierCreditConfig {
  // After a failed lookup, skip lookups (no credit) for this long; > 0.
  absl::Duration breaker_open = absl::Seconds(1);
  // Longest continuation asked per worker, in blocks (bounds each MGET); >= 1.
  int64_t max_blocks = 256;

  // InvalidArgument naming the field.
  absl::Status Validate() const;
};

// Counters since creation (pd_router_tier_credit_* metrics).
struct TierCreditStats {
  uint64_t lookups_total = 0;           // round trips to the lookup (successful or not)
  uint64_t errors_total = 0;            // failed round trips (each opens the breaker)
  uint64_t skipped_total = 0;           // Extend calls that skipped the lookup: breaker open
  uint64_t credited_workers_total = 0;  // worker overlaps extended by a lookup
  uint64_t dram_blocks_total = 0;       // DRAM blocks credited by those extensions
  uint64_t nvme_blocks_total = 0;       // NVMe blocks credited by those extensions
  bool breaker_open = false;            // now
};

// A worker the request may be placed on, with the node its tierd serves.
struct NodeWorker {
  std::string worker_id;
  std::string node;
};

// The pure merge step of Extend (exposed for tests): `tiers` is what `worker_id`'s node holds of
// the chain from block `start` = the worker's HBM hits on. When the continuation is longer than
// the worker's reported dram + nvme blocks, they are replaced by its counts (the entry is added
// when the worker had none). Returns true when the overlap changed.
bool MergeTierContinuation(const std::string& worker_id, int64_t start,
                           absl::Span<const redis::PrefixTier> tiers,
                           std::vector<WorkerOverlap>* overlaps);

class TierCredit {
 public:
  // `lookup` is owned; `clock` (not owned, outlives this) times the breaker. InvalidArgument
  // for a bad config or a null lookup.
  static absl::StatusOr<std::unique_ptr<TierCredit>> Create(std::unique_ptr<TierLookup> lookup,
                                                            TierCreditConfig config,
                                                            Clock* clock = Clock::Real());

  // Extends `overlaps` (KvIndex::Match of `chain`) for `workers` whose node names are valid
  // (others are left alone), with one lookup for all distinct (node, HBM hits) pairs. Never
  // fails: without Redis the overlaps stay as they are.
  void Extend(absl::Span<const BlockHash> chain, absl::Span<const NodeWorker> workers,
              std::vector<WorkerOverlap>* overlaps);

  TierCreditStats Stats() const;

 private:
  TierCredit(std::unique_ptr<TierLookup> lookup, TierCreditConfig config, Clock* clock);

  const std::unique_ptr<TierLookup> lookup_;
  const TierCreditConfig config_;
  Clock* const clock_;

  mutable absl::Mutex mu_;
  absl::Time open_until_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  bool failing_ ABSL_GUARDED_BY(mu_) = false;  // the last lookup failed (for logging once)
  TierCreditStats stats_ ABSL_GUARDED_BY(mu_);
};

}  // namespace pd::router
