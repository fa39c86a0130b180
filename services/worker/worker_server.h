// WorkerServer: pd-worker's model runtime, engine loop, KV handoff and gRPC server.
//
// Start() does every fallible step up front (model load, transport, port) so that bad
// configuration is a startup error naming the flag. Thread-safe.
#pragma once

#include <atomic>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/metrics/metrics.h"
#include "engine/disagg/kv_handoff.h"
#include "engine/runtime/engine_loop.h"
#include "engine/runtime/model_runtime.h"
#include "services/kv_events/kv_event_publisher.h"
#include "services/tier_client/tier_client.h"
#include "services/worker/decode_service.h"
#include "services/worker/local_block_set.h"
#include "services/worker/prefill_service.h"
#include "services/worker/worker_config.h"
#include "services/worker/worker_context.h"

namespace grpc {
class Server;
}

namespace pd::worker {

class WorkerServer {
 public:
  // `metrics` must outlive the server. Errors: those of the model runtime (NotFound,
  // InvalidArgument naming the file), the transport (Unimplemented for an unbuilt backend) and
  // Unavailable naming --grpc_address when the port is taken.
  static absl::StatusOr<std::unique_ptr<WorkerServer>> Start(const WorkerConfig& config,
                                                             metrics::Registry* metrics);
  ~WorkerServer();

  std::string address() const;
  int port() const { return port_; }
  const WorkerContext& context() const { return ctx_; }
  // One line for the startup log.
  std::string Describe() const;

  // End the KV event streams (UNAVAILABLE: routers resubscribe elsewhere or later), NOT_SERVING
  // on health, stop accepting calls, wait up to `timeout` for in-flight calls (the engine keeps
  // running them), cancel the rest, then stop the engine. Idempotent. With drain by
  // migration the running streams' blocks are first offered to the node's tiers (when it has
  // some and they are not written through already), then the streams are handed over.
  void Drain(absl::Duration timeout);

 private:
  WorkerServer() = default;

  // Drain by migration: the running streams' computed blocks to the tiers, flushed (bounded).
  void OfferRunningBlocksToTiers();

  WorkerContext ctx_;
  int port_ = 0;
  metrics::Registry* registry_ = nullptr;
  metrics::CollectorId collector_;
  // Declared before the runtime (its listener) and the server (its service): outlives both.
  std::unique_ptr<kv_events::KvEventPublisher> kv_events_;
  std::unique_ptr<LocalBlockSet> local_blocks_;  // the pool's listener, forwards to kv_events_
  // Where the pool's eviction hook finds the tier client (set once it attached by worker id,
  // cleared before it is destroyed).
  std::shared_ptr<std::atomic<tier_client::TierLink*>> tier_slot_;
  std::unique_ptr<tier_client::TierClient> tiers_;
  std::unique_ptr<engine::ModelRuntime> runtime_;
  std::unique_ptr<engine::EngineLoop> loop_;
  std::unique_ptr<disagg::KvHandoff> handoff_;
  std::unique_ptr<DecodeServiceImpl> decode_;
  std::unique_ptr<PrefillServiceImpl> prefill_;
  std::unique_ptr<grpc::Server> server_;
};

}  // namespace pd::worker
