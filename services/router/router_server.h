// RouterServer: pd-router's gRPC server and what it owns (services, the Redis client).
//
// Start() does every fallible step up front so bad configuration is a startup error: Redis
// reachable (when configured), the listen port free, the server built. Thread-safe.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/metrics/metrics.h"
#include "common/redis/redis_client.h"
#include "engine/chat/chat_template.h"
#include "engine/runtime/model_front.h"
#include "services/router/generation_service.h"
#include "services/router/kv_event_feed.h"
#include "services/router/kv_index.h"
#include "services/router/router_config.h"
#include "services/router/tier_credit.h"
#include "services/router/worker_pool.h"

namespace grpc {
class Server;
}

namespace pd::router {

class RouterServer {
 public:
  // Errors: Unavailable naming host:port when Redis cannot be reached or the gRPC port is taken;
  // InvalidArgument for an invalid config; the model loader's errors naming --model. `metrics`
  // must outlive the server. `chat_template` (may be null) renders the HTTP API's chat prompts
  // (GenerationService::prompts).
  static absl::StatusOr<std::unique_ptr<RouterServer>> Start(
      const RouterConfig& config, metrics::Registry* metrics,
      std::unique_ptr<chat::ChatTemplate> chat_template = nullptr);
  ~RouterServer();

  // Blocks until a decode worker is healthy or `timeout` passes (start-up logs, tests).
  bool WaitForWorkers(absl::Duration timeout) const { return pool_->WaitForDecodeWorker(timeout); }
  WorkerPool* pool() { return pool_.get(); }
  const engine::ModelFront& model() const { return *model_; }
  // The public API's service, which the OpenAI HTTP front (openai/http_front.h) shares.
  GenerationService* generation() { return generation_.get(); }

  // The bound gRPC address (the real port when configured with port 0).
  std::string address() const;
  int port() const { return port_; }

  // Marks the server NOT_SERVING on the health service, stops accepting calls, waits up to
  // `timeout` for in-flight calls, then cancels the rest. Idempotent.
  void Drain(absl::Duration timeout);

 private:
  RouterServer() = default;

  RouterConfig config_;
  int port_ = 0;
  metrics::Registry* metrics_ = nullptr;
  metrics::CollectorId collector_;
  std::unique_ptr<redis::RedisClient> redis_;
  std::unique_ptr<engine::ModelFront> model_;
  // Declared in dependency order: the pool calls the feed, the feed writes the index.
  std::unique_ptr<KvIndex> index_;
  std::unique_ptr<KvEventFeed> feed_;
  std::unique_ptr<WorkerPool> pool_;
  std::unique_ptr<TierCredit> tier_credit_;  // null without Redis; used by policy_
  const RedisTierLookup* redis_lookup_ = nullptr;  // tier_credit_'s lookup; null without Redis
  std::unique_ptr<PlacementPolicy> policy_;
  std::unique_ptr<GenerationService> generation_;
  std::unique_ptr<grpc::Server> server_;
};

}  // namespace pd::router
