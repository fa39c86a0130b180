// TierdServer: everything one pd-tierd process runs: the DRAM pool, the optional NVMe store,
// the admission guard and TierStore, the gRPC TierService (plus grpc.health.v1), the optional
// Redis prefix index, metrics, and one maintenance thread.
//
// The maintenance thread, every maintenance_interval: expires claims whose lease ended, spills
// DRAM down to its low watermark once it is above the high one, and drops sessions idle for
// session_idle_timeout. Separately, every change of a block's tier (TierStore's change
// listener) is queued and resolved into the block's current fastest tier by the index thread,
// which hands it to the LocationSink (the Redis prefix index): publish {node, tier} or
// unpublish.
//
// Start() does every fallible step up front (model, shared memory, NVMe directory, port) so
// bad configuration is a startup error naming the flag. Redis being down is not an error: the
// index connects (and repopulates itself) when Redis comes up.
//
// Thread-safety: Start, Drain and the accessors may be called from any thread.
#pragma once

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "common/metrics/metrics.h"
#include "services/tierd/admission_guard.h"
#include "services/tierd/dram_pool.h"
#include "services/tierd/nvme_store.h"
#include "services/tierd/peer_link.h"
#include "services/tierd/redis_index.h"
#include "services/tierd/tier_service.h"
#include "services/tierd/tier_store.h"
#include "services/tierd/tierd_config.h"

namespace grpc {
class Server;
}

namespace pd::tierd {

// Where the node's block locations are mirrored (the cluster's Redis prefix index). Calls come
// from the index thread only; implementations queue and return quickly.
class LocationSink {
 public:
  virtual ~LocationSink() = default;
  // The node holds `hash`, fastest in `tier`.
  virtual void Publish(const BlockHash& hash, tier_shm::TierKind tier) = 0;
  // The node no longer holds `hash` in any tier.
  virtual void Unpublish(const BlockHash& hash) = 0;
};

class TierdServer {
 public:
  // `metrics` must outlive the server. `sink` (may be null: Redis is then built from
  // config.redis, or absent) is for tests that observe the index updates; not owned.
  // Errors: InvalidArgument (config), NotFound/InvalidArgument naming the model file,
  // ResourceExhausted naming the shared-memory object or the NVMe directory, Unavailable naming
  // --grpc_address when the port is taken.
  static absl::StatusOr<std::unique_ptr<TierdServer>> Start(const TierdConfig& config,
                                                            metrics::Registry* metrics,
                                                            LocationSink* sink = nullptr);
  ~TierdServer();

  // "127.0.0.1:PORT" as bound.
  std::string address() const;
  int port() const { return port_; }
  const std::string& node_name() const { return node_; }
  // One line for the startup log.
  std::string Describe() const;

  TierStore* store() { return store_.get(); }
  TierServiceImpl* service() { return service_.get(); }
  PeerLink* peer() { return peer_.get(); }  // null without --peer_transport

  // Waits until every tier change queued so far has been handed to the sink (tests).
  void FlushIndexForTest();
  // Runs one maintenance pass (what the maintenance thread does every maintenance_interval) on
  // the calling thread and returns when it is done, so a test can check its effect instead of
  // sleeping until the thread has run (tests). Passes never overlap.
  void RunMaintenanceForTest();

  // NOT_SERVING on health, stops accepting calls, waits up to `timeout` for in-flight calls,
  // stops the threads and flushes the index. Idempotent.
  void Drain(absl::Duration timeout);

 private:
  TierdServer() = default;

  void MaintenanceLoop();
  void MaintenancePass() ABSL_LOCKS_EXCLUDED(maintenance_mu_, mu_);
  void IndexLoop();
  // Resolves the queued hashes into Publish/Unpublish calls. Returns how many. Calls are
  // serialized, so when it returns every change queued before the call has been published,
  // including those another thread had already taken off the queue.
  size_t ResolveChanges() ABSL_LOCKS_EXCLUDED(resolve_mu_, mu_);
  void RegisterMetrics(metrics::Registry* registry);

  TierdConfig config_;
  std::string node_;
  int port_ = 0;
  metrics::Registry* registry_ = nullptr;
  metrics::CollectorId collector_;

  std::unique_ptr<DramPool> dram_;
  std::unique_ptr<NvmeStore> nvme_;
  std::unique_ptr<AdmissionGuard> guard_;
  std::unique_ptr<TierStore> store_;
  std::unique_ptr<TierServiceImpl> service_;
  std::unique_ptr<RedisIndex> redis_index_;       // when --redis_address is set
  std::unique_ptr<LocationSink> owned_sink_;      // forwards to redis_index_
  std::unique_ptr<PeerLink> peer_;                // with --peer_transport
  RedisPeerDirectory* peer_directory_ = nullptr;  // owned by peer_
  LocationSink* sink_ = nullptr;                  // owned_sink_ or the caller's; may be null
  std::unique_ptr<grpc::Server> server_;

  absl::Mutex maintenance_mu_ ABSL_ACQUIRED_BEFORE(mu_);  // one MaintenancePass at a time
  absl::Time last_prune_ ABSL_GUARDED_BY(maintenance_mu_);
  absl::Time last_announce_ ABSL_GUARDED_BY(maintenance_mu_);
  absl::Mutex resolve_mu_ ABSL_ACQUIRED_BEFORE(mu_);  // one ResolveChanges at a time
  absl::Mutex mu_;
  absl::flat_hash_set<BlockHash> changed_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t resolved_total_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t spill_rounds_total_ ABSL_GUARDED_BY(mu_) = 0;
  std::thread maintenance_;
  std::thread indexer_;
};

}  // namespace pd::tierd
