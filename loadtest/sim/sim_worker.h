// SimWorker: one simulated pd-worker for pd-routesim (the router simulator, docs/loadtest.md
// "Router simulator"). It keeps the engine's own KV bookkeeping (engine/kvcache
// KvCacheManager: an LRU prefix cache of block hashes in which the blocks of running requests
// are pinned) and a simple time model:
//
//   prefill   one request at a time, FIFO: uncached prompt tokens / prefill_tokens_per_s +
//             prefill_overhead. The prefix hit is taken when the prefill starts (as the
//             engine's AllocatePrompt does), and the computed full blocks become cache hits
//             (CommitBlocks) when it ends, which is also the request's first token.
//   fetch     with a RemoteFetcher attached (remote_fetch.h), the blocks after the local hit
//             that another worker holds may be fetched when the prefill starts; the prefill
//             then computes only the rest, after the fetch ends (it needs the fetched KV), and
//             the fetched blocks are committed with the computed ones. The prefill slot is
//             held during the fetch (an engine could prefill another request meanwhile: this
//             is the conservative side).
//   decode    all prefilled requests decode together; one step (one token for each) takes
//             decode_step + decode_step_per_seq × batch size, progress is continuous between
//             events (a fluid approximation of discrete steps). A request needs
//             output_tokens − 1 steps after its first token. Decode runs alongside prefill
//             without slowing it (an ideal chunked-prefill engine).
//   KV blocks a request holds its prompt blocks plus blocks for all its output tokens from
//             the start of its prefill to the end of its decode (reserved up front, so there
//             is no preemption). The head of the prefill queue waits until its blocks fit.
//             Output blocks are not committed: the trace has no ids for decode KV, so they
//             could never be hit.
//
// The worker publishes what its pool reports (KvEventListener) as KvEventBatch protos with the
// worker's epoch and gap-free sequence numbers (TakeEventBatch), and its load as the fields of
// a WorkerLoad (Load). Several workers may share one KvCacheManager (the "pooled cache"
// baseline); then none of them publishes events.
//
// Times are nanoseconds of simulated time. Thread-compatible: the simulator's single thread
// owns every worker.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/hash/block_hash.h"
#include "engine/kvcache/kv_cache_manager.h"
#include "engine/kvcache/kv_event_listener.h"
#include "pd/v1/kv_events.pb.h"

namespace pd::loadtest::sim {

// The time model's constants (flags of pd-routesim; defaults there).
struct TimeModel {
  double prefill_tokens_per_s = 8000;                            // > 0
  absl::Duration prefill_overhead = absl::Milliseconds(20);      // per prefill, >= 0
  absl::Duration decode_step = absl::Milliseconds(30);           // batch of one, > 0
  absl::Duration decode_step_per_seq = absl::Microseconds(300);  // per sequence in the batch, >= 0

  // InvalidArgument naming the field.
  absl::Status Validate() const;
};

// One request as a worker sees it. Owned by the simulator; the worker keeps a pointer from
// Enqueue until the request is returned as finished.
struct SimRequest {
  int64_t id = 0;  // unique per simulation; the engine sequence id
  int64_t arrival_ns = 0;
  int64_t prompt_tokens = 0;
  int64_t output_tokens = 0;
  std::vector<BlockHash> chain;  // hashes of the prompt's full blocks

  // Filled by the worker.
  int64_t cached_tokens = 0;      // prefix-cache hit when the prefill started
  int64_t fetched_tokens = 0;     // fetched from another worker then (not in cached_tokens)
  int64_t fetch_ns = 0;           // prefill start -> fetched blocks in place (link queue included)
  bool recompute_chosen = false;  // another worker held blocks, recomputing them was faster
  int64_t prefill_start_ns = -1;
  int64_t first_token_ns = -1;  // end of the prefill
  int64_t end_ns = -1;          // end of the decode
  double remaining_steps = 0;   // decode steps still to run
};

// A worker's load as its GetLoad would report it (proto WorkerLoad's fields).
struct SimLoad {
  int64_t queued_prefill_tokens = 0;  // waiting prompts in full + the rest of the one prefilling
  int64_t active_kv_blocks = 0;       // pool blocks in use (ref > 0)
  int64_t free_kv_blocks = 0;         // free + evictable
  int64_t total_kv_blocks = 0;
  int64_t running = 0;  // prefilling or decoding
  int64_t waiting = 0;  // in the prefill queue
};

// Cumulative counters of one worker.
struct SimWorkerStats {
  int64_t requests = 0;          // prefills started
  int64_t prompt_tokens = 0;     // of those
  int64_t cached_tokens = 0;     // prefix hits of those
  int64_t prefill_tokens = 0;    // tokens computed by prefills (prompt − cached − fetched)
  int64_t fetched_tokens = 0;    // tokens fetched from other workers
  int64_t fetches = 0;           // prefills that fetched
  int64_t fetch_ns = 0;          // sum of their fetch times (link queue included)
  int64_t recompute_chosen = 0;  // prefills that recomputed blocks another worker held
  int64_t prefill_busy_ns = 0;
  int64_t stored_blocks = 0;   // blocks in BlockStored events published
  int64_t removed_blocks = 0;  // blocks in BlockRemoved events published
};

class RemoteFetcher;

class SimWorker : private kvcache::KvEventListener {
 public:
  // A worker with its own pool of `capacity_blocks` blocks whose events it publishes, or, when
  // `shared_pool` is not null, one using that pool (not owned; it must outlive the worker) and
  // publishing nothing. InvalidArgument for a bad capacity or block size.
  static absl::StatusOr<std::unique_ptr<SimWorker>> Create(std::string worker_id, uint64_t epoch,
                                                           const TimeModel& time,
                                                           int64_t block_size,
                                                           int64_t capacity_blocks,
                                                           kvcache::KvCacheManager* shared_pool);

  // A pool for Create's `shared_pool` (no listener). InvalidArgument for a bad size.
  static absl::StatusOr<std::unique_ptr<kvcache::KvCacheManager>> MakeSharedPool(
      int64_t num_blocks, int64_t block_size);

  SimWorker(const SimWorker&) = delete;
  SimWorker& operator=(const SimWorker&) = delete;

  const std::string& worker_id() const { return worker_id_; }

  // Lets this worker's prefills fetch from other workers' pools through `fetcher` (not owned;
  // it must outlive the worker), `index` being this worker's index there. Call before the
  // first Enqueue; null = no remote fetch (the default).
  void AttachRemoteFetcher(RemoteFetcher* fetcher, int index) {
    fetcher_ = fetcher;
    fetcher_index_ = index;
  }

  // The worker's pool (its own or the shared one).
  const kvcache::KvCacheManager& pool() const { return *pool_; }

  // Brings the worker to `now_ns` (>= every earlier call): decode progress, finished decodes
  // (appended to `finished`, their blocks released), a finished prefill, then starts the next
  // prefill when its blocks fit. Call at NextEventNs() and whenever the pool may have freed
  // blocks (a shared pool).
  void Advance(int64_t now_ns, std::vector<SimRequest*>* finished);

  // Queues `request` for prefill at `now_ns` (Advance first). Requests whose blocks can never
  // fit the pool must be filtered out by the caller (BlocksNeeded > pool size).
  void Enqueue(SimRequest* request, int64_t now_ns, std::vector<SimRequest*>* finished);

  // When the worker next changes by itself (a prefill or a decode ends); nullopt when idle or
  // blocked on KV blocks.
  std::optional<int64_t> NextEventNs() const;

  // Blocks a request needs at once: ceil((prompt + output tokens) / block_size).
  int64_t BlocksNeeded(const SimRequest& request) const;

  // The load report at `now_ns` (the worker must have been advanced to it).
  SimLoad Load(int64_t now_ns) const;

  // Prompt tokens waiting or being prefilled, as Load counts them.
  int64_t QueuedPrefillTokens(int64_t now_ns) const;

  // Requests queued, prefilling or decoding.
  int64_t NumRequests() const;

  // True when the head of the queue waits for KV blocks.
  bool Blocked() const { return blocked_; }

  // The events published since the last call, as one batch (worker_id, epoch, events numbered
  // from the last batch's); nullopt when there are none.
  std::optional<pdserve::internal::v1::KvEventBatch> TakeEventBatch();

  const SimWorkerStats& stats() const { return stats_; }

 private:
  // KvEventListener (called inside pool operations).
  void OnBlocksStored(absl::Span<const BlockHash> hashes, std::optional<BlockHash> parent) override;
  void OnBlocksRemoved(absl::Span<const BlockHash> hashes) override;
  void OnAllCleared() override;
  pdserve::internal::v1::KvEvent* NewEvent();

  // Decode progress from last_advance_ns_ to now_ns.
  void AdvanceDecode(int64_t now_ns, std::vector<SimRequest*>* finished);
  void FinishPrefill(std::vector<SimRequest*>* finished);
  void Release(SimRequest* request, int64_t now_ns, std::vector<SimRequest*>* finished);
  void TryStartPrefill(int64_t now_ns);
  double StepNs() const;

  SimWorker(std::string worker_id, uint64_t epoch, const TimeModel& time, int64_t block_size);

  const std::string worker_id_;
  const uint64_t epoch_;
  std::unique_ptr<kvcache::KvCacheManager> own_pool_;  // null with a shared pool
  kvcache::KvCacheManager* pool_ = nullptr;            // own_pool_ or the shared one
  const TimeModel time_;
  const int64_t block_size_;
  RemoteFetcher* fetcher_ = nullptr;
  int fetcher_index_ = -1;

  std::deque<SimRequest*> queue_;
  SimRequest* prefilling_ = nullptr;
  int64_t prefill_end_ns_ = 0;
  int64_t prefill_tokens_ = 0;  // tokens the prefill in progress computes (not hit or fetched)
  bool blocked_ = false;
  std::vector<SimRequest*> decoding_;
  int64_t last_advance_ns_ = 0;

  uint64_t next_sequence_ = 1;
  std::vector<pdserve::internal::v1::KvEvent> pending_events_;
  SimWorkerStats stats_;
};

}  // namespace pd::loadtest::sim
