#include "services/tierd/tierd_server.h"

#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/log/log.h"
#include "engine/disagg/kv_handoff.h"
#include "engine/runtime/model_front.h"
#include "engine/runtime/model_runtime.h"
#include "services/base/auth.h"
#include "services/base/grpc_security.h"
#include "services/base/kv_layout_proto.h"

namespace pd::tierd {

namespace {

// The Redis prefix index as the server's location sink.
class RedisSink final : public LocationSink {
 public:
  explicit RedisSink(RedisIndex* index) : index_(index) {}
  void Publish(const BlockHash& hash, tier_shm::TierKind tier) override {
    index_->Publish(hash, tier);
  }
  void Unpublish(const BlockHash& hash) override { index_->Unpublish(hash); }

 private:
  RedisIndex* const index_;
};

// Lifetime of this node's peer:<node> address in Redis; renewed every third of it.
constexpr absl::Duration kPeerAddressTtl = absl::Seconds(30);

}  // namespace

absl::StatusOr<std::unique_ptr<TierdServer>> TierdServer::Start(const TierdConfig& config,
                                                                metrics::Registry* metrics,
                                                                LocationSink* sink) {
  PD_RETURN_IF_ERROR(config.Validate());
  PD_RETURN_IF_ERROR(services::CheckCanListen(config.grpc_address, "--grpc_address"));
  std::unique_ptr<TierdServer> s(new TierdServer());
  s->config_ = config;
  s->node_ = config.node_name.empty() ? services::HostName() : config.node_name;

  // The layout and fingerprint exactly as the workers compute them.
  absl::StatusOr<std::unique_ptr<engine::ModelFront>> front =
      engine::ModelFront::Load(config.model, config.tokenizer, config.weight_dtype);
  if (!front.ok()) {
    return absl::Status(front.status().code(),
                        absl::StrCat("--model ", config.model, ": ", front.status().message()));
  }
  const kvcache::KvLayout layout =
      engine::KvLayoutForModel((*front)->config(), config.block_size, config.kv_dtype);
  PD_RETURN_IF_ERROR(layout.Validate());
  const std::string fingerprint = (*front)->fingerprint();

  DramPoolConfig dram;
  dram.shm_name =
      config.shm_name.empty() ? DramPoolConfig::DefaultShmName(s->node_) : config.shm_name;
  dram.block_bytes = layout.block_bytes();
  dram.num_slots = (config.dram_mib << 20) / tier_shm::SlotBytesFor(layout.block_bytes());
  if (dram.num_slots < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--dram_mib ", config.dram_mib, " holds no block of ", layout.block_bytes(), " bytes"));
  }
  dram.high_watermark = config.high_watermark;
  dram.low_watermark = config.low_watermark;
  dram.lease = config.lease;
  absl::StatusOr<std::unique_ptr<DramPool>> pool = DramPool::Create(dram);
  if (!pool.ok()) {
    return absl::Status(pool.status().code(),
                        absl::StrCat("--dram_mib ", config.dram_mib, " (", dram.num_slots,
                                     " slots): ", pool.status().message()));
  }
  s->dram_ = *std::move(pool);

  if (!config.nvme_dir.empty()) {
    NvmeStoreConfig nvme;
    nvme.dir = config.nvme_dir;
    nvme.block_bytes = layout.block_bytes();
    nvme.capacity_blocks = std::max<int64_t>(
        1, (config.nvme_mib << 20) / tier_shm::SlotBytesFor(layout.block_bytes()));
    nvme.model_fingerprint = fingerprint;
    nvme.verify_on_open = config.nvme_verify_on_open;
    absl::StatusOr<std::unique_ptr<NvmeStore>> store = NvmeStore::Open(nvme);
    if (!store.ok()) {
      return absl::Status(store.status().code(), absl::StrCat("--nvme_dir ", config.nvme_dir, ": ",
                                                              store.status().message()));
    }
    s->nvme_ = *std::move(store);
  }
  s->guard_ = std::make_unique<AdmissionGuard>();
  s->store_ = std::make_unique<TierStore>(s->dram_.get(), s->nvme_.get(), s->guard_.get());
  services::ClusterTokenVerifier auth;
  if (!config.cluster_token_file.empty()) {
    PD_ASSIGN_OR_RETURN(std::string token,
                        services::ReadSecretFile(config.cluster_token_file, "--cluster_token_file",
                                                 services::kMinClusterTokenBytes));
    auth = services::ClusterTokenVerifier(token);
  }
  PD_ASSIGN_OR_RETURN(std::shared_ptr<grpc::ServerCredentials> credentials,
                      services::MakeServerCredentials(config.tls));
  s->service_ = std::make_unique<TierServiceImpl>(
      s->store_.get(), services::LayoutToProto(layout, fingerprint), std::move(auth));
  s->service_->SetNodeName(s->node_);

  TierdServer* self = s.get();
  if (sink != nullptr) {
    s->sink_ = sink;
  } else if (config.redis.has_value()) {
    RedisIndexConfig ic;
    ic.node = s->node_;
    ic.entry_ttl = config.redis_entry_ttl;
    absl::StatusOr<std::unique_ptr<RedisIndex>> index =
        RedisIndex::Create(*config.redis, ic, [self] { return self->store_->Snapshot(); });
    if (!index.ok()) {
      return absl::Status(index.status().code(),
                          absl::StrCat("--redis_address: ", index.status().message()));
    }
    s->redis_index_ = *std::move(index);
    s->owned_sink_ = std::make_unique<RedisSink>(s->redis_index_.get());
    s->service_->SetRedisIndex(s->redis_index_.get());
    s->sink_ = s->owned_sink_.get();
  }
  s->store_->SetChangeListener([self](absl::Span<const BlockHash> hashes) {
    absl::MutexLock lock(&self->mu_);
    self->changed_.insert(hashes.begin(), hashes.end());
  });
  if (s->sink_ != nullptr && s->redis_index_ == nullptr) {
    // A restarted tierd holds what its NVMe manifest replayed: announce it (the Redis index
    // does this itself, from the snapshot, whenever it (re)connects).
    for (const auto& [hash, tier] : s->store_->Snapshot()) {
      s->sink_->Publish(hash, tier);
    }
  }

  if (!config.peer_transport.empty()) {
    PeerLinkConfig pc;
    pc.transport.backend = config.peer_transport;
    pc.transport.listen_host = config.peer_transport_host;
    pc.max_reads = config.peer_max_reads;
    pc.max_fetch_blocks = config.peer_fetch_max_blocks;
    pc.chunk_blocks = config.peer_fetch_chunk_blocks;
    pc.always_fetch = config.peer_fetch_policy == "always";
    pc.fetch_timeout = config.peer_fetch_timeout;
    pc.node = s->node_;
    // Outgoing calls to other tierds: this tierd's certificate (mTLS) and CA, the cluster token.
    std::vector<services::CallHeader> headers;
    if (!config.cluster_token_file.empty()) {
      PD_ASSIGN_OR_RETURN(std::string token, services::ReadSecretFile(
                                                 config.cluster_token_file, "--cluster_token_file",
                                                 services::kMinClusterTokenBytes));
      headers.push_back(services::ClusterTokenHeader(token));
    }
    services::TlsClientConfig peer_tls;
    if (config.tls.enabled()) {
      peer_tls = {config.tls.client_ca_file, config.tls.cert_file, config.tls.key_file};
    }
    PD_ASSIGN_OR_RETURN(std::shared_ptr<const services::ClientSecurity> peer_security,
                        services::ClientSecurity::Create(peer_tls, std::move(headers), "--tls_"));
    auto directory = std::make_unique<RedisPeerDirectory>(
        *config.redis, s->node_, config.peer_advertise_address, kPeerAddressTtl);
    s->peer_directory_ = directory.get();
    PD_ASSIGN_OR_RETURN(transport::PoolGeometry geometry,
                        disagg::GeometryFor(layout, fingerprint, s->dram_->num_slots()));
    PD_ASSIGN_OR_RETURN(s->peer_,
                        PeerLink::Create(std::move(pc), s->store_.get(), std::move(geometry),
                                         std::move(directory), std::move(peer_security)));
    s->service_->SetPeerLink(s->peer_.get());
  }

  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  builder.AddListeningPort(config.grpc_address.ToString(), credentials, &s->port_);
  builder.SetMaxReceiveMessageSize(16 << 20);
  builder.RegisterService(s->service_.get());
  s->server_ = builder.BuildAndStart();
  if (s->server_ == nullptr || s->port_ == 0) {
    return absl::UnavailableError(
        absl::StrCat("--grpc_address ", config.grpc_address.ToString(), ": cannot start server"));
  }
  if (s->peer_ != nullptr) {
    if (config.peer_advertise_address.empty()) {
      s->peer_directory_->SetAddress(s->address());
    }
    s->peer_->Announce();
  }
  {
    absl::MutexLock lock(&s->maintenance_mu_);
    s->last_prune_ = s->last_announce_ = absl::Now();
  }
  s->maintenance_ = std::thread([self] { self->MaintenanceLoop(); });
  s->indexer_ = std::thread([self] { self->IndexLoop(); });
  s->RegisterMetrics(metrics);
  s->server_->GetHealthCheckService()->SetServingStatus(true);
  // Once started: a startup error stays one line.
  if (config.cluster_token_file.empty()) {
    services::WarnUnauthenticatedInternalRpcs(
        "pd-tierd",
        "anyone who can reach it can attach to its DRAM pool, read every cached KV block and "
        "plant blocks that workers then restore into other users' answers (the "
        "conflicting-commit check catches a planted block only once a real worker offers it)");
  }
  return s;
}

TierdServer::~TierdServer() {
  Drain(absl::ZeroDuration());
  if (registry_ != nullptr) {
    registry_->RemoveCollector(collector_);
  }
}

std::string TierdServer::address() const {
  return services::HostPort{config_.grpc_address.host, port_}.ToString();
}

std::string TierdServer::Describe() const {
  std::string out = absl::StrCat(
      "tierd on node ", node_, " at ", address(),
      config_.tls.enabled() ? (config_.tls.client_ca_file.empty() ? " (tls)" : " (mtls)")
                            : " (plaintext)",
      config_.cluster_token_file.empty() ? "" : ", cluster token on", ": DRAM ", dram_->num_slots(),
      " slots of ", dram_->block_bytes(), " bytes in ", dram_->shm_name());
  if (nvme_ != nullptr) {
    const NvmeStoreStats st = nvme_->Stats();
    absl::StrAppend(&out, ", NVMe ", st.capacity_blocks, " blocks in ", nvme_->dir(), " (",
                    st.io_mode, ", ", st.replayed_blocks, " replayed)");
  } else {
    absl::StrAppend(&out, ", no NVMe tier");
  }
  if (peer_ != nullptr) {
    absl::StrAppend(&out, ", peer transport ", config_.peer_transport, " (max ",
                    config_.peer_max_reads, " reads served)");
  }
  absl::StrAppend(
      &out, redis_index_ != nullptr
                ? absl::StrCat(", redis index at ", config_.redis->host, ":", config_.redis->port)
                : (sink_ != nullptr ? ", location index on" : ", no redis index"));
  return out;
}

void TierdServer::MaintenanceLoop() {
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      if (mu_.AwaitWithTimeout(absl::Condition(&stopping_), config_.maintenance_interval)) {
        return;
      }
    }
    MaintenancePass();
  }
}

void TierdServer::RunMaintenanceForTest() { MaintenancePass(); }

void TierdServer::MaintenancePass() {
  absl::MutexLock pass_lock(&maintenance_mu_);
  const int expired = store_->ExpireClaims();
  if (expired > 0) {
    LOG(WARNING) << "tierd: " << expired << " claims expired (a worker did not release them)";
  }
  const SpillResult spilled = store_->SpillToWatermark();
  if (spilled.total() > 0) {
    VLOG(1) << "tierd: spilled " << spilled.total() << " blocks (" << spilled.written
            << " written to NVMe, " << spilled.dropped << " dropped)";
    absl::MutexLock lock(&mu_);
    ++spill_rounds_total_;
  }
  if (peer_ != nullptr && absl::Now() - last_announce_ > kPeerAddressTtl / 3) {
    peer_->Announce();
    last_announce_ = absl::Now();
  }
  if (absl::Now() - last_prune_ > config_.session_idle_timeout / 4) {
    service_->PruneIdleSessions(config_.session_idle_timeout);
    last_prune_ = absl::Now();
  }
}

size_t TierdServer::ResolveChanges() {
  // Held across the publish: a caller that finds the queue empty still waits for the indexer
  // thread's batch in flight (FlushIndexForTest returned before it and the test read "unknown").
  absl::MutexLock resolve(&resolve_mu_);
  absl::flat_hash_set<BlockHash> changed;
  {
    absl::MutexLock lock(&mu_);
    changed.swap(changed_);
  }
  if (sink_ == nullptr) {
    return 0;
  }
  for (const BlockHash& hash : changed) {
    const std::vector<tier_shm::TierKind> tier = store_->Lookup(absl::MakeConstSpan(&hash, 1));
    if (tier.empty()) {
      sink_->Unpublish(hash);
    } else {
      sink_->Publish(hash, tier[0]);
    }
  }
  absl::MutexLock lock(&mu_);
  resolved_total_ += changed.size();
  return changed.size();
}

void TierdServer::IndexLoop() {
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stopping_ || !changed_.empty();
      };
      mu_.AwaitWithTimeout(absl::Condition(&ready), absl::Milliseconds(100));
      if (stopping_) {
        break;
      }
    }
    ResolveChanges();
  }
  ResolveChanges();
}

void TierdServer::FlushIndexForTest() { ResolveChanges(); }

void TierdServer::Drain(absl::Duration timeout) {
  if (server_ != nullptr) {
    server_->GetHealthCheckService()->SetServingStatus(false);
    server_->Shutdown(absl::ToChronoTime(absl::Now() + timeout));
    server_->Wait();
    server_.reset();
  }
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (maintenance_.joinable()) {
    maintenance_.join();
  }
  if (indexer_.joinable()) {
    indexer_.join();
  }
  if (redis_index_ != nullptr) {
    if (absl::Status s = redis_index_->Flush(); !s.ok()) {
      LOG(WARNING) << "tierd: last index updates not written to redis: " << s;
    }
  }
}

void TierdServer::RegisterMetrics(metrics::Registry* registry) {
  registry_ = registry;
  collector_ = registry->AddCollector([this](metrics::CollectorSink& sink) {
    const TierStoreStats st = store_->Stats();
    const TierServiceStats sv = service_->ServiceStats();
    const auto d = [](auto v) { return static_cast<double>(v); };
    // The families every tier reports, labelled by tier.
    const auto tier = [&](const char* name, int64_t capacity, int64_t blocks, int64_t bytes,
                          uint64_t stored, uint64_t evicted, uint64_t hits, uint64_t corrupt) {
      const metrics::LabelPairs l = {{"tier", name}};
      sink.AddGauge("pd_tierd_capacity_blocks", "Blocks each tier can hold", d(capacity), l);
      sink.AddGauge("pd_tierd_blocks", "Blocks held per tier (DRAM: valid, i.e. readable)",
                    d(blocks), l);
      sink.AddGauge("pd_tierd_bytes", "Block bytes held per tier", d(bytes), l);
      sink.AddCounter("pd_tierd_stored_blocks_total", "Blocks stored into each tier", d(stored), l);
      sink.AddCounter("pd_tierd_evicted_blocks_total", "Blocks that left each tier to make room",
                      d(evicted), l);
      sink.AddCounter("pd_tierd_hit_blocks_total", "Blocks served to workers from each tier",
                      d(hits), l);
      sink.AddCounter("pd_tierd_checksum_failures_total",
                      "Blocks dropped because their bytes failed the checksum", d(corrupt), l);
    };
    tier("dram", st.dram.capacity_blocks, st.dram.valid_blocks,
         st.dram.valid_blocks * dram_->block_bytes(), st.dram.stored_blocks_total,
         st.dram.evicted_blocks_total, st.dram.hit_blocks_total,
         st.dram.checksum_failures_total + st.dram_corrupt_total);
    sink.AddGauge("pd_tierd_claimed_blocks",
                  "DRAM slots reserved for a named block or pinned by workers",
                  d(st.dram.pinned_blocks - st.dram.unbound_blocks));
    sink.AddGauge("pd_tierd_unbound_reserved_blocks",
                  "DRAM slots workers keep reserved for in-place offers (named at Commit)",
                  d(st.dram.unbound_blocks));
    if (st.nvme.has_value()) {
      tier("nvme", st.nvme->capacity_blocks, st.nvme->used_blocks,
           st.nvme->used_blocks * nvme_->block_bytes(), st.nvme->stored_blocks_total,
           st.nvme->evicted_blocks_total, st.nvme->hit_blocks_total,
           st.nvme->checksum_failures_total);
      sink.AddGauge("pd_tierd_nvme_accepting_spills",
                    "1 while the NVMe tier accepts spills, 0 after a disk-full error",
                    st.nvme->accepting_spills ? 1 : 0);
      sink.AddGauge("pd_tierd_nvme_replayed_blocks",
                    "NVMe blocks found again at startup by replaying the manifest",
                    d(st.nvme->replayed_blocks));
      sink.AddGauge("pd_tierd_nvme_replay_dropped_blocks",
                    "Manifest entries dropped at startup (foreign model, invalid, corrupt)",
                    d(st.nvme->replay_foreign_dropped + st.nvme->replay_invalid_dropped +
                      st.nvme->replay_corrupt_dropped));
      sink.AddCounter("pd_tierd_nvme_write_failures_total", "NVMe writes that failed",
                      d(st.nvme->write_failures_total));
      sink.AddCounter("pd_tierd_nvme_disk_full_total",
                      "Times the NVMe tier stopped accepting spills (disk full)",
                      d(st.nvme->disk_full_total));
    }
    sink.AddCounter("pd_tierd_spill_blocks_total", "Blocks written DRAM -> NVMe by spills",
                    d(st.spilled_blocks_total));
    sink.AddCounter("pd_tierd_spill_dropped_blocks_total",
                    "Blocks that left DRAM without reaching NVMe (not admitted, no room, failed)",
                    d(st.spill_dropped_blocks_total));
    sink.AddCounter("pd_tierd_spill_bytes_total", "Bytes written by spills",
                    d(st.spill_bytes_total));
    sink.AddCounter("pd_tierd_spill_seconds_total", "Wall time of spill rounds that wrote",
                    absl::ToDoubleSeconds(st.spill_time_total));
    sink.AddCounter("pd_tierd_restore_blocks_total", "Blocks read NVMe -> DRAM by Promote",
                    d(st.restored_blocks_total));
    sink.AddCounter("pd_tierd_restore_bytes_total", "Bytes read by NVMe restores",
                    d(st.restore_bytes_total));
    sink.AddCounter("pd_tierd_restore_seconds_total", "Wall time of NVMe restores",
                    absl::ToDoubleSeconds(st.restore_time_total));
    sink.AddCounter("pd_tierd_restore_failures_total", "NVMe reads that failed (checksum incl.)",
                    d(st.restore_failures_total));
    sink.AddCounter("pd_tierd_conflicting_commits_total",
                    "Blocks offered under a held hash with another checksum (held copy dropped, "
                    "hash refused from then on): a planted block or a faulty worker",
                    d(st.conflicting_commits_total));
    sink.AddCounter("pd_tierd_refused_disputed_total",
                    "Offers and commits refused because their hash is disputed",
                    d(st.refused_disputed_total));
    sink.AddGauge("pd_tierd_disputed_blocks", "Hashes refused now as disputed",
                  d(st.disputed_blocks));
    if (redis_index_ != nullptr) {
      for (size_t k = 0; k < redis::kNumPrefixGarbageKinds; ++k) {
        const auto kind = static_cast<redis::PrefixGarbage>(k);
        uint64_t n = redis_index_->garbage().total(kind);
        if (peer_directory_ != nullptr) {
          n += peer_directory_->garbage().total(kind);
        }
        sink.AddCounter("pd_tierd_redis_garbage_total",
                        "Redis prefix index entries pdserve never writes, skipped (and logged)",
                        d(n), {{"kind", std::string(redis::PrefixGarbageName(kind))}});
      }
      const RedisIndexStats r = redis_index_->Stats();
      sink.AddGauge("pd_tierd_redis_connected", "1 while the Redis prefix index is reachable",
                    r.connected ? 1 : 0);
      sink.AddGauge("pd_tierd_redis_pending_updates", "Index updates waiting to be written",
                    d(r.pending));
      sink.AddCounter("pd_tierd_redis_published_total", "Block entries written to Redis",
                      d(r.published_total));
      sink.AddCounter("pd_tierd_redis_unpublished_total", "Block entries deleted from Redis",
                      d(r.unpublished_total));
      sink.AddCounter("pd_tierd_redis_dropped_updates_total",
                      "Index updates dropped because the queue was full (a resync follows)",
                      d(r.dropped_total));
      sink.AddCounter("pd_tierd_redis_resyncs_total",
                      "Full republishes of the node's blocks (connects, recoveries, TTL refresh)",
                      d(r.resyncs_total));
      sink.AddCounter("pd_tierd_redis_errors_total", "Failed Redis connects and calls",
                      d(r.errors_total));
      sink.AddCounter("pd_tierd_redis_batches_total", "Pipelined round trips to Redis",
                      d(r.batches_total));
      sink.AddCounter("pd_tierd_redis_seconds_total", "Wall time inside Redis round trips",
                      absl::ToDoubleSeconds(r.flush_time_total));
    }
    sink.AddGauge("pd_tierd_sessions", "Workers attached", d(sv.sessions));
    sink.AddCounter("pd_tierd_lookups_total", "Lookup calls", d(sv.lookups_total));
    sink.AddCounter("pd_tierd_lookup_hit_blocks_total", "Leading hits returned by Lookup",
                    d(sv.lookup_hit_blocks_total));
    sink.AddCounter("pd_tierd_promotes_total", "Promote calls", d(sv.promotes_total));
    sink.AddCounter("pd_tierd_promote_hit_blocks_total", "Blocks made readable by Promote",
                    d(sv.promote_hit_blocks_total));
    sink.AddCounter("pd_tierd_unknown_session_total", "Calls naming an unknown session",
                    d(sv.unknown_session_total));
    sink.AddCounter("pd_tierd_attach_rejected_total",
                    "Attach calls refused (layout mismatch, bad request)",
                    d(sv.attach_rejected_total));
    sink.AddCounter("pd_tierd_promote_remote_blocks_total",
                    "Blocks Promote fetched from other nodes' tierds for the call",
                    d(sv.promote_remote_blocks_total));
    if (peer_ != nullptr) {
      const PeerLinkStats p = peer_->Stats();
      for (const auto& [result, n] : {std::pair<const char*, uint64_t>{"ok", p.reads_total},
                                      {"short", p.reads_short_total},
                                      {"busy", p.reads_busy_total},
                                      {"failed", p.reads_failed_total}}) {
        sink.AddCounter("pd_tierd_peer_reads_total",
                        "PeerRead calls served to other nodes, by result", d(n),
                        {{"result", result}});
      }
      sink.AddCounter("pd_tierd_peer_read_blocks_total", "Blocks sent to other nodes",
                      d(p.read_blocks_total));
      sink.AddCounter("pd_tierd_peer_read_bytes_total", "Block bytes sent to other nodes",
                      d(p.read_bytes_total));
      sink.AddGauge("pd_tierd_peer_reads_in_flight", "PeerRead calls being served now",
                    d(p.reads_in_flight));
      sink.AddGauge("pd_tierd_peer_pinned_blocks", "Blocks pinned by PeerRead calls now",
                    d(p.pinned_blocks));
      sink.AddCounter("pd_tierd_peer_decisions_total",
                      "Fetch-or-recompute decisions when another node held blocks",
                      d(p.decided_fetch_total), {{"decision", "fetch"}});
      sink.AddCounter("pd_tierd_peer_decisions_total",
                      "Fetch-or-recompute decisions when another node held blocks",
                      d(p.decided_recompute_total), {{"decision", "recompute"}});
      sink.AddCounter("pd_tierd_peer_estimated_fetch_seconds_total",
                      "Estimated fetch time of the blocks decided on (decision input)",
                      p.estimated_fetch_seconds_total);
      sink.AddCounter("pd_tierd_peer_recompute_seconds_total",
                      "The workers' recompute time of the blocks decided on (decision input)",
                      p.recompute_seconds_total);
      sink.AddCounter("pd_tierd_peer_fetch_abandoned_total",
                      "Fetches cut short at a chunk boundary: behind the recompute budget",
                      d(p.fetch_abandoned_total));
      sink.AddCounter("pd_tierd_peer_fetches_total",
                      "Fetches from other nodes attempted (a holder was found)",
                      d(p.fetches_total));
      sink.AddCounter("pd_tierd_peer_fetch_failures_total",
                      "Fetches that stored nothing (holder dead, busy, timed out, ...)",
                      d(p.fetch_failures_total));
      sink.AddCounter("pd_tierd_peer_lookup_failures_total",
                      "Failed lookups of other nodes' blocks in Redis", d(p.lookup_failures_total));
      sink.AddCounter("pd_tierd_peer_fetched_blocks_total", "Blocks fetched from other nodes",
                      d(p.fetched_blocks_total));
      sink.AddCounter("pd_tierd_peer_fetched_bytes_total", "Block bytes fetched from other nodes",
                      d(p.fetched_bytes_total));
      sink.AddCounter("pd_tierd_peer_fetch_corrupt_total",
                      "Fetched blocks that failed the holder's checksum", d(p.fetch_corrupt_total));
      for (const PeerLinkStats::Path& path : p.paths) {
        sink.AddGauge("pd_tierd_peer_path_latency_seconds",
                      "Fitted latency of one fetch request from this holder node",
                      path.latency_seconds, {{"node", path.node}});
        sink.AddGauge("pd_tierd_peer_path_bandwidth_bytes_per_second",
                      "Fitted bandwidth of fetches from this holder node", path.bytes_per_second,
                      {{"node", path.node}});
      }
      sink.AddCounter("pd_tierd_peer_fetch_seconds_total",
                      "Wall time of fetches that stored blocks",
                      absl::ToDoubleSeconds(p.fetch_time_total));
    }
  });
}

}  // namespace pd::tierd
