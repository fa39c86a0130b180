// What pd-worker's request path shares: the engine loop, the KV handoff, the node's tiers, the
// metrics and the worker's identity (WorkerContext), and the metrics themselves (WorkerMetrics).
// WorkerServer builds one WorkerContext; the services, the prefill jobs and the remote prefills
// read it.
//
// Thread-safety: WorkerContext is filled in before any request arrives and only read after, so
// it is safe to share; NewRequestId is thread-safe.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/base/strong_id.h"
#include "common/metrics/metrics.h"
#include "engine/disagg/kv_handoff.h"
#include "engine/runtime/engine_loop.h"
#include "engine/runtime/model_runtime.h"
#include "pd/v1/worker.pb.h"
#include "services/base/auth.h"
#include "services/base/grpc_security.h"
#include "services/tier_client/tier_link.h"
#include "services/worker/local_block_set.h"
#include "services/worker/worker_config.h"

namespace pd::worker {

// Metrics of one worker process (docs/operations.md lists them).
struct WorkerMetrics {
  metrics::Family<metrics::Counter>* requests = nullptr;           // {rpc, code}
  metrics::Family<metrics::Histogram>* ttft = nullptr;             // seconds, decode side
  metrics::Family<metrics::Histogram>* tpot = nullptr;             // seconds
  metrics::Family<metrics::Histogram>* queue = nullptr;            // seconds
  metrics::Family<metrics::Histogram>* e2e = nullptr;              // seconds
  metrics::Family<metrics::Counter>* prefills = nullptr;           // {where=local|remote|fallback}
  metrics::Family<metrics::Counter>* kv_transfer_bytes = nullptr;  // {direction}
  metrics::Family<metrics::Histogram>* kv_transfer_seconds = nullptr;  // {direction}
  metrics::Family<metrics::Counter>* tokens = nullptr;  // {kind=prompt|cached|generated}

  // AlreadyExists when `registry` has these names already (one worker per registry).
  static absl::StatusOr<WorkerMetrics> Register(metrics::Registry* registry);

  // Counts one finished internal RPC (`rpc` e.g. "Decode.Generate") with its final code.
  void CountRequest(absl::string_view rpc, absl::StatusCode code) const;
};

// What every part of the request path shares. Everything pointed to must outlive the services
// and every request in flight.
struct WorkerContext {
  WorkerConfig config;
  std::string worker_id;
  std::string node_name;
  std::string grpc_address;  // as bound
  engine::ModelRuntime* runtime = nullptr;
  engine::EngineLoop* loop = nullptr;
  disagg::KvHandoff* handoff = nullptr;
  // The node's tiers (null without --tierd_address) and the pool's cached hashes (set with it).
  tier_client::TierLink* tiers = nullptr;
  const LocalBlockSet* local_blocks = nullptr;
  pdserve::internal::v1::KvLayout layout;
  WorkerMetrics metrics;
  // Every internal call must carry the cluster token when enabled (UNAUTHENTICATED otherwise).
  services::ClusterTokenVerifier cluster_auth;
  // TLS and cluster token of this worker's calls to prefill workers; null = plaintext.
  std::shared_ptr<const services::ClientSecurity> peer_security;

  pdserve::internal::v1::WorkerInfo Info() const;
  pdserve::internal::v1::WorkerLoad Load() const;
  // A request id unique in this process (the engine's key of a request).
  pd::RequestId NewRequestId();

 private:
  std::atomic<uint64_t> next_request_id_{1};
};

}  // namespace pd::worker
