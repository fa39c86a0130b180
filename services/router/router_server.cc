#include "services/router/router_server.h"

#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/base/status_macros.h"
#include "common/log/log.h"
#include "services/base/auth.h"
#include "services/base/grpc_security.h"
#include "services/base/kv_dtype_proto.h"
#include "services/router/placement.h"

namespace pd::router {

absl::StatusOr<std::unique_ptr<RouterServer>> RouterServer::Start(
    const RouterConfig& config, metrics::Registry* metrics,
    std::unique_ptr<chat::ChatTemplate> chat_template) {
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
  // Security files are read once, here: a bad file is a startup error naming its flag.
  PD_ASSIGN_OR_RETURN(std::shared_ptr<grpc::ServerCredentials> server_credentials,
                      services::MakeServerCredentials(config.tls));
  std::vector<services::CallHeader> worker_headers;
  if (!config.cluster_token_file.empty()) {
    PD_ASSIGN_OR_RETURN(std::string token,
                        services::ReadSecretFile(config.cluster_token_file, "--cluster_token_file",
                                                 services::kMinClusterTokenBytes));
    worker_headers.push_back(services::ClusterTokenHeader(token));
  }
  PD_ASSIGN_OR_RETURN(std::shared_ptr<const services::ClientSecurity> worker_security,
                      services::ClientSecurity::Create(config.worker_tls, worker_headers));
  std::optional<services::ApiKeyStore> api_keys;
  if (!config.api_keys_file.empty()) {
    PD_ASSIGN_OR_RETURN(api_keys, services::ApiKeyStore::ReadFile(config.api_keys_file));
    LOG(INFO) << "public API: " << api_keys->num_keys() << " api keys of "
              << api_keys->num_tenants() << " tenants";
  }
  absl::StatusOr<std::unique_ptr<engine::ModelFront>> model =
      engine::ModelFront::Load(config.model, config.tokenizer, config.weight_dtype);
  if (!model.ok()) {
    return absl::Status(model.status().code(),
                        absl::StrCat("--model: ", model.status().message()));
  }
  server->model_ = *std::move(model);
  WorkerPoolOptions pool_options;
  pool_options.health_interval = config.health_interval;
  pool_options.rpc_timeout = config.health_timeout;
  pool_options.max_missed_checks = config.health_missed_checks;
  pool_options.model_fingerprint = server->model_->fingerprint();
  pool_options.block_size = static_cast<uint32_t>(config.block_size);
  pool_options.kv_dtype = services::KvDtypeToProto(config.kv_dtype);
  pool_options.security = worker_security;
  KvIndexConfig index_config;
  const bool auto_bound = config.index_max_blocks == 0;
  index_config.max_blocks = auto_bound ? kAutoIndexMinBlocks : config.index_max_blocks;
  PD_ASSIGN_OR_RETURN(server->index_, KvIndex::Create(index_config));
  KvEventFeedOptions feed_options;
  feed_options.security = worker_security;
  server->feed_ = std::make_unique<KvEventFeed>(server->index_.get(), feed_options);
  KvEventFeed* feed = server->feed_.get();
  KvIndex* index = server->index_.get();
  // Automatic bound: every worker's pool size as it last reported it (a worker that left keeps
  // its share: its blocks may return with it), kAutoIndexEntriesPerBlock entries per block.
  struct PoolSizes {
    absl::Mutex mu;  // health callbacks come from one thread per worker
    absl::flat_hash_map<std::string, int64_t> blocks ABSL_GUARDED_BY(mu);
  };
  auto sizes = std::make_shared<PoolSizes>();
  auto on_health = [feed, index, auto_bound, sizes](const WorkerSnapshot& w) {
    feed->Poke();
    if (auto_bound && w.healthy && w.load.total_kv_blocks() > 0) {
      int64_t total = 0;
      {
        absl::MutexLock lock(&sizes->mu);
        sizes->blocks[w.address] = static_cast<int64_t>(w.load.total_kv_blocks());
        for (const auto& [address, blocks] : sizes->blocks) total += blocks;
      }
      index->RaiseMaxBlocks(AutoIndexBound(total));
    }
  };
  PD_ASSIGN_OR_RETURN(server->pool_,
                      WorkerPool::Create(config.decode_workers, config.prefill_workers,
                                         pool_options, std::move(on_health)));
  WorkerPool* pool_ptr = server->pool_.get();
  feed->Start([pool_ptr] { return pool_ptr->Snapshot(); });
  if (config.redis.has_value()) {
    // Lower-tier credit from the nodes' tierd entries in Redis, on connections of its own.
    PD_ASSIGN_OR_RETURN(std::unique_ptr<RedisTierLookup> lookup,
                        RedisTierLookup::Create(*config.redis, config.redis_lookup_timeout));
    server->redis_lookup_ = lookup.get();  // owned by tier_credit_
    PD_ASSIGN_OR_RETURN(server->tier_credit_, TierCredit::Create(std::move(lookup), {}));
  }
  PD_ASSIGN_OR_RETURN(server->policy_, MakePlacementPolicy(config, server->index_.get(),
                                                           server->tier_credit_.get()));
  PD_ASSIGN_OR_RETURN(server->generation_,
                      GenerationService::Create(config, server->model_.get(), server->pool_.get(),
                                                server->policy_.get(), metrics, std::move(api_keys),
                                                std::move(chat_template)));

  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  builder.AddListeningPort(config.grpc_address.ToString(), server_credentials, &server->port_);
  builder.SetMaxReceiveMessageSize(static_cast<int>(config.max_message_bytes));
  builder.RegisterService(server->generation_.get());
  server->server_ = builder.BuildAndStart();
  if (server->server_ == nullptr || server->port_ == 0) {
    return absl::UnavailableError(
        absl::StrCat("--grpc_address ", config.grpc_address.ToString(), ": cannot start server"));
  }
  WorkerPool* pool = server->pool_.get();
  GenerationService* gen = server->generation_.get();
  server->metrics_ = metrics;
  TierCredit* credit = server->tier_credit_.get();
  const RedisTierLookup* redis_lookup = server->redis_lookup_;
  server->collector_ = metrics->AddCollector([pool, gen, index, feed, credit,
                                              redis_lookup](metrics::CollectorSink& sink) {
    if (redis_lookup != nullptr) {
      sink.AddCounter(
          "pd_router_redis_garbage_total",
          "Redis prefix index entries pdserve never writes, skipped (values that "
          "are no tier)",
          static_cast<double>(redis_lookup->garbage().total(redis::PrefixGarbage::kTierValue)),
          {{"kind", "tier_value"}});
    }
    if (credit != nullptr) {
      const TierCreditStats cs = credit->Stats();
      sink.AddCounter("pd_router_tier_credit_lookups_total",
                      "Redis prefix index lookups made while placing requests",
                      static_cast<double>(cs.lookups_total));
      sink.AddCounter("pd_router_tier_credit_errors_total",
                      "Failed or timed-out Redis prefix index lookups (placed without credit)",
                      static_cast<double>(cs.errors_total));
      sink.AddCounter("pd_router_tier_credit_skipped_total",
                      "Placements without a lookup: breaker open after a failure, or all "
                      "lookup connections busy",
                      static_cast<double>(cs.skipped_total));
      sink.AddGauge("pd_router_tier_credit_breaker_open",
                    "1 while Redis lookups are paused after a failure", cs.breaker_open ? 1 : 0);
      sink.AddCounter("pd_router_tier_credit_workers_total",
                      "Worker overlaps extended by lower-tier blocks from Redis",
                      static_cast<double>(cs.credited_workers_total));
      sink.AddCounter("pd_router_tier_credit_blocks_total",
                      "Lower-tier blocks credited from Redis, by tier",
                      static_cast<double>(cs.dram_blocks_total), {{"tier", "dram"}});
      sink.AddCounter("pd_router_tier_credit_blocks_total",
                      "Lower-tier blocks credited from Redis, by tier",
                      static_cast<double>(cs.nvme_blocks_total), {{"tier", "nvme"}});
    }
    const KvEventFeedStats fs = feed->Stats();
    sink.AddGauge("pd_router_kv_event_streams", "Workers whose KV events are followed",
                  static_cast<double>(fs.subscribers));
    sink.AddGauge("pd_router_kv_event_streams_connected",
                  "Followed workers with a live KV event stream", static_cast<double>(fs.connected));
    sink.AddCounter("pd_router_kv_event_apply_errors_total",
                    "KV event batches the index refused (each forces a snapshot)",
                    static_cast<double>(fs.apply_errors));
    const KvIndexStats st = index->Stats();
    sink.AddGauge("pd_router_index_blocks", "Distinct KV blocks some worker holds (KV index)",
                  static_cast<double>(st.blocks));
    sink.AddGauge("pd_router_index_entries", "(worker, block, tier) entries in the KV index",
                  static_cast<double>(st.entries));
    sink.AddGauge("pd_router_index_workers", "Workers with state in the KV index",
                  static_cast<double>(st.workers));
    sink.AddGauge("pd_router_index_max_entries",
                  "Bound of the KV index in entries (--index_max_blocks, or the automatic bound)",
                  static_cast<double>(st.max_blocks));
    sink.AddCounter("pd_router_index_evictions_total",
                    "Index entries dropped by --index_max_blocks", static_cast<double>(st.evictions));
    sink.AddCounter("pd_router_index_events_total", "KV events applied to the index",
                    static_cast<double>(st.events_applied));
    sink.AddCounter("pd_router_index_rejected_batches_total",
                    "KV event batches the index refused (the stream is resynced)",
                    static_cast<double>(st.rejected_batches));
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
  feed_->Stop();  // placement needs no fresh events while draining
  server_->GetHealthCheckService()->SetServingStatus(false);
  server_->Shutdown(absl::ToChronoTime(absl::Now() + timeout));
  server_->Wait();
  server_.reset();
}

}  // namespace pd::router
