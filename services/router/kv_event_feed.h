// KvEventFeed: keeps the router's KvIndex fed with the KV events of every healthy worker
// (docs/architecture.md, "KV events"). One KvEventSubscriber per healthy worker address applies
// its batches with KvIndex::Apply under the worker's id (WorkerInfo.worker_id); when a worker
// leaves the pool its subscriber is stopped and its entries are removed from the index, and
// when it rejoins (perhaps restarted, with a new epoch) a new subscriber starts with a snapshot.
//
// The feed reconciles from the pool's snapshot on its own thread: health callbacks only wake it
// (they may run on gRPC threads, which must not block on joining a subscriber), and it also
// reconciles every `reconcile_interval` so a missed callback costs at most that long.
//
// Thread-safe.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "services/kv_events/kv_event_subscriber.h"
#include "services/router/kv_index.h"
#include "services/router/worker_pool.h"

namespace pd::router {

struct KvEventFeedOptions {
  std::string subscriber_id = "pd-router";
  absl::Duration reconcile_interval = absl::Seconds(1);
  absl::Duration idle_timeout = absl::Seconds(5);  // > the workers' heartbeat interval (1 s)
  // TLS and cluster token of the streams from the workers; null = plaintext, no token.
  std::shared_ptr<const services::ClientSecurity> security;
};

struct KvEventFeedStats {
  int64_t subscribers = 0;  // workers followed now
  int64_t connected = 0;    // of them, with a live stream
  int64_t reconnects = 0;   // summed over the current subscribers
  int64_t resyncs = 0;      // snapshots forced by an error, summed likewise
  int64_t apply_errors = 0; // batches KvIndex refused, since start
};

class KvEventFeed {
 public:
  // `index` must outlive the feed.
  KvEventFeed(KvIndex* index, KvEventFeedOptions options);
  // Stop().
  ~KvEventFeed();

  // Starts following the workers `snapshot` returns (healthy ones); call once. `snapshot`
  // must stay callable until Stop.
  void Start(std::function<std::vector<WorkerSnapshot>()> snapshot);

  // Wakes the feed to reconcile now (a worker's health changed). Never blocks; any thread.
  void Poke();

  // Stops every subscriber and the thread. Idempotent. The index keeps its entries.
  void Stop();

  KvEventFeedStats Stats() const;

 private:
  struct Follow {
    std::string worker_id;
    std::unique_ptr<kv_events::KvEventSubscriber> subscriber;
  };

  void Run();
  void Reconcile();

  KvIndex* const index_;
  const KvEventFeedOptions options_;
  std::function<std::vector<WorkerSnapshot>()> snapshot_;

  mutable absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool poked_ ABSL_GUARDED_BY(mu_) = false;
  // By worker address. Changed only on the feed's thread (and by Stop after it is joined).
  absl::flat_hash_map<std::string, Follow> follows_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<std::atomic<int64_t>> apply_errors_ = std::make_shared<std::atomic<int64_t>>(0);
  std::thread thread_;
};

}  // namespace pd::router
