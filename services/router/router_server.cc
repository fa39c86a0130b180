#include "services/router/router_server.h"

#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/log/log.h"
#include "services/router/placement.h"

namespace pd::router {

absl::StatusOr<std::unique_ptr<RouterServer>> RouterServer::Start(const RouterConfig& config,
                                                                  metrics::Registry* metrics) {
  PD_RETURN_IF_ERROR(config.Validate());
  std::unique_ptr<RouterServer> server(new RouterServer());
  server->config_ = config;
  if (config.redis.has_value()) {
    absl::StatusOr<std::unique_ptr<redis::RedisClient>> client =
        redis::RedisClient::Connect(*config.redis);
    if (!client.ok()) {
      return absl::Status(client.status().code(),
                          absl::StrCat("--redis_address: ", client.status().message()));
    }
    server->redis_ = *std::move(client);
  }
  PD_RETURN_IF_ERROR(services::CheckCanListen(config.grpc_address, "--grpc_address"));
  absl::StatusOr<std::unique_ptr<engine::ModelFront>> model =
      engine::ModelFront::Load(config.model, config.tokenizer);
  if (!model.ok()) {
    return absl::Status(model.status().code(),
                        absl::StrCat("--model: ", model.status().message()));
  }
  server->model_ = *std::move(model);
  WorkerPoolOptions pool_options;
  pool_options.health_interval = config.health_interval;
  pool_options.model_fingerprint = server->model_->fingerprint();
  pool_options.block_size = static_cast<uint32_t>(config.block_size);
  PD_ASSIGN_OR_RETURN(server->pool_, WorkerPool::Create(config.decode_workers,
                                                        config.prefill_workers, pool_options));
  PD_ASSIGN_OR_RETURN(server->policy_, MakePlacementPolicy(config));
  PD_ASSIGN_OR_RETURN(server->generation_,
                      GenerationService::Create(config, server->model_.get(), server->pool_.get(),
                                                server->policy_.get(), metrics));

  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  builder.AddListeningPort(config.grpc_address.ToString(), grpc::InsecureServerCredentials(),
                           &server->port_);
  builder.RegisterService(server->generation_.get());
  server->server_ = builder.BuildAndStart();
  if (server->server_ == nullptr || server->port_ == 0) {
    return absl::UnavailableError(
        absl::StrCat("--grpc_address ", config.grpc_address.ToString(), ": cannot start server"));
  }
  WorkerPool* pool = server->pool_.get();
  GenerationService* gen = server->generation_.get();
  server->metrics_ = metrics;
  server->collector_ = metrics->AddCollector([pool, gen](metrics::CollectorSink& sink) {
    int64_t healthy = 0;
    for (const WorkerSnapshot& w : pool->Snapshot()) {
      healthy += w.healthy ? 1 : 0;
      sink.AddGauge("pd_router_worker_up", "1 while the worker is in the pool",
                    w.healthy ? 1 : 0, {{"worker", w.address}});
      sink.AddGauge("pd_router_worker_inflight", "Streams this router has open on the worker",
                    static_cast<double>(w.inflight), {{"worker", w.address}});
      sink.AddGauge("pd_router_worker_queued_prefill_tokens",
                    "Prompt tokens waiting on the worker (last load report)",
                    static_cast<double>(w.load.queued_prefill_tokens()), {{"worker", w.address}});
    }
    sink.AddGauge("pd_router_workers_healthy", "Workers in the pool", static_cast<double>(healthy));
    sink.AddGauge("pd_router_inflight_streams", "Generate streams open",
                  static_cast<double>(gen->inflight()));
  });
  server->server_->GetHealthCheckService()->SetServingStatus(true);
  return server;
}

RouterServer::~RouterServer() {
  Drain(absl::ZeroDuration());
  if (metrics_ != nullptr) {
    metrics_->RemoveCollector(collector_);
  }
}

std::string RouterServer::address() const {
  return services::HostPort{config_.grpc_address.host, port_}.ToString();
}

void RouterServer::Drain(absl::Duration timeout) {
  if (server_ == nullptr) {
    return;
  }
  server_->GetHealthCheckService()->SetServingStatus(false);
  server_->Shutdown(absl::ToChronoTime(absl::Now() + timeout));
  server_->Wait();
  server_.reset();
}

}  // namespace pd::router
