// pd-worker's internal gRPC services (proto/pd/v1/worker.proto): DecodeService (run a request,
// prefilling remotely through a prefill worker or locally) and PrefillService (prefill a prompt
// into a decode worker's blocks). Both drive one EngineLoop and share one KvHandoff.
//
// Thread-safety: handlers run on gRPC callback threads; engine callbacks on the engine loop
// thread; transfer completions on the handoff's thread. All classes here are thread-safe.
#pragma once

#include <memory>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "common/metrics/metrics.h"
#include "engine/disagg/kv_handoff.h"
#include "engine/runtime/engine_loop.h"
#include "engine/runtime/model_runtime.h"
#include "pd/v1/worker.grpc.pb.h"
#include "services/base/auth.h"
#include "services/base/grpc_security.h"
#include "services/tierd/tier_client.h"
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

  static absl::StatusOr<WorkerMetrics> Register(metrics::Registry* registry);
};

// What both services share. Everything must outlive the services.
struct WorkerContext {
  WorkerConfig config;
  std::string worker_id;
  std::string node_name;
  std::string grpc_address;  // as bound
  engine::ModelRuntime* runtime = nullptr;
  engine::EngineLoop* loop = nullptr;
  disagg::KvHandoff* handoff = nullptr;
  // The node's tiers (null without --tierd_address) and the pool's cached hashes.
  tierd::TierClient* tiers = nullptr;
  const LocalBlockSet* local_blocks = nullptr;
  pdserve::internal::v1::KvLayout layout;
  WorkerMetrics metrics;
  // Every internal call must carry the cluster token when enabled (UNAUTHENTICATED otherwise).
  services::ClusterTokenVerifier cluster_auth;
  // TLS and cluster token of this worker's calls to prefill workers; null = plaintext.
  std::shared_ptr<const services::ClientSecurity> peer_security;

  pdserve::internal::v1::WorkerInfo Info() const;
  pdserve::internal::v1::WorkerLoad Load() const;
  pd::RequestId NewRequestId();

 private:
  std::atomic<uint64_t> next_request_id_{1};
};

// Channels to prefill workers, one per address, created on first use.
class PrefillClients {
 public:
  // `security` null = plaintext, no token.
  explicit PrefillClients(std::shared_ptr<const services::ClientSecurity> security)
      : security_(security != nullptr ? std::move(security)
                                      : services::ClientSecurity::Insecure()) {}
  pdserve::internal::v1::PrefillService::Stub* Get(const std::string& address);

 private:
  const std::shared_ptr<const services::ClientSecurity> security_;
  absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::unique_ptr<pdserve::internal::v1::PrefillService::Stub>>
      stubs_ ABSL_GUARDED_BY(mu_);
};

class DecodeServiceImpl final : public pdserve::internal::v1::DecodeService::CallbackService {
 public:
  explicit DecodeServiceImpl(WorkerContext* ctx)
      : ctx_(ctx), prefill_clients_(ctx->peer_security) {}

  grpc::ServerWriteReactor<pdserve::internal::v1::DecodeResponse>* Generate(
      grpc::CallbackServerContext* context,
      const pdserve::internal::v1::DecodeRequest* request) override;
  grpc::ServerUnaryReactor* GetLoad(grpc::CallbackServerContext* context,
                                    const pdserve::internal::v1::GetLoadRequest* request,
                                    pdserve::internal::v1::WorkerLoad* response) override;
  grpc::ServerUnaryReactor* GetInfo(grpc::CallbackServerContext* context,
                                    const pdserve::internal::v1::GetInfoRequest* request,
                                    pdserve::internal::v1::WorkerInfo* response) override;

 private:
  WorkerContext* ctx_;
  PrefillClients prefill_clients_;
};

class PrefillServiceImpl final : public pdserve::internal::v1::PrefillService::CallbackService {
 public:
  explicit PrefillServiceImpl(WorkerContext* ctx) : ctx_(ctx) {}

  grpc::ServerUnaryReactor* Prefill(grpc::CallbackServerContext* context,
                                    const pdserve::internal::v1::PrefillRequest* request,
                                    pdserve::internal::v1::PrefillResponse* response) override;
  grpc::ServerUnaryReactor* GetLoad(grpc::CallbackServerContext* context,
                                    const pdserve::internal::v1::GetLoadRequest* request,
                                    pdserve::internal::v1::WorkerLoad* response) override;
  grpc::ServerUnaryReactor* GetInfo(grpc::CallbackServerContext* context,
                                    const pdserve::internal::v1::GetInfoRequest* request,
                                    pdserve::internal::v1::WorkerInfo* response) override;

 private:
  WorkerContext* ctx_;
};

}  // namespace pd::worker
