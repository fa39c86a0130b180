#include "services/worker/worker_server.h"

#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "common/base/status_macros.h"
#include "common/log/log.h"
#include "kernels/device_memory.h"
#include "services/base/auth.h"
#include "services/base/grpc_security.h"
#include "services/base/grpc_status.h"
#include "services/base/kv_layout_proto.h"
#include "services/worker/tier_restore.h"

namespace pd::worker {

absl::StatusOr<std::unique_ptr<WorkerServer>> WorkerServer::Start(const WorkerConfig& config,
                                                                  metrics::Registry* metrics) {
  PD_RETURN_IF_ERROR(config.Validate());
  PD_RETURN_IF_ERROR(services::CheckCanListen(config.grpc_address, "--grpc_address"));
  std::unique_ptr<WorkerServer> s(new WorkerServer());
  s->registry_ = metrics;
  WorkerContext& ctx = s->ctx_;
  ctx.config = config;
  PD_ASSIGN_OR_RETURN(ctx.metrics, WorkerMetrics::Register(metrics));
  // Security files are read once, here: a bad file is a startup error naming its flag.
  PD_ASSIGN_OR_RETURN(std::shared_ptr<grpc::ServerCredentials> server_credentials,
                      services::MakeServerCredentials(config.tls));
  std::vector<services::CallHeader> peer_headers;
  if (!config.cluster_token_file.empty()) {
    PD_ASSIGN_OR_RETURN(std::string token,
                        services::ReadSecretFile(config.cluster_token_file, "--cluster_token_file",
                                                 services::kMinClusterTokenBytes));
    ctx.cluster_auth = services::ClusterTokenVerifier(token);
    peer_headers.push_back(services::ClusterTokenHeader(token));
  }
  PD_ASSIGN_OR_RETURN(ctx.peer_security,
                      services::ClientSecurity::Create(config.peer_tls, std::move(peer_headers)));
  // The publisher must exist before the runtime (it is the pool's listener), but the worker id
  // defaults to the gRPC address as bound, known only once the server is up (port 0 picks it):
  // it starts with --worker_id, possibly empty, and gets the final id right after the bind.
  // Until then it refuses subscribers with UNAVAILABLE. Events are stamped with the id when
  // written to a stream, so none goes out under another id.
  kv_events::KvEventPublisherConfig events;
  events.worker_id = config.worker_id;
  events.block_size = config.runtime.block_size;
  events.cluster_auth = ctx.cluster_auth;
  PD_ASSIGN_OR_RETURN(s->kv_events_, kv_events::KvEventPublisher::Create(events));
  engine::ModelRuntimeConfig runtime_config = config.runtime;
  runtime_config.kv_listener = s->kv_events_.get();
  if (!config.tierd_address.empty()) {
    s->local_blocks_ = std::make_unique<LocalBlockSet>(s->kv_events_.get());
    runtime_config.kv_listener = s->local_blocks_.get();
    s->tier_slot_ = std::make_shared<std::atomic<tier_client::TierLink*>>(nullptr);
    // Scheduler thread, inside an allocation: the client copies the block and returns.
    runtime_config.on_evict = TierOfferHook(s->tier_slot_);
    if (config.tier_write_through) {
      // Offered again at eviction: tierd answers "already held" without a slot (a write-through
      // offer dropped while tierd was down or staging was full gets its second chance there).
      runtime_config.on_store = runtime_config.on_evict;
    }
  }
  // The transport comes first so that the KV pool can live in memory it allocated (UCX: a
  // shared segment a decode peer on this host writes with one memcpy); the pool is registered
  // once the model has fixed its geometry. handoff_ is destroyed before runtime_ (members).
  disagg::KvHandoffConfig handoff;
  handoff.transport.backend = config.transport;
  handoff.transport.listen_host = config.transport_host;
  if (runtime_config.device == kernels::Device::kCuda) {
    handoff.memory_kind = transport::MemoryKind::kCuda;
  }
  const auto transport_error = [&](const absl::Status& e) {
    // With --device cuda the backend must register device memory; say which flag pair failed.
    const bool gpu_pool_refused = handoff.memory_kind == transport::MemoryKind::kCuda &&
                                  e.code() == absl::StatusCode::kUnimplemented;
    return absl::Status(
        e.code(), absl::StrCat("--transport ", config.transport, " with --device ",
                               engine::DeviceName(runtime_config.device), ": ", e.message(),
                               gpu_pool_refused ? " (this backend does not register GPU memory; "
                                                  "pd-generate --device cuda runs the engine alone)"
                                                : ""));
  };
  absl::StatusOr<std::unique_ptr<disagg::KvHandoff>> h =
      disagg::KvHandoff::CreateUnregistered(handoff);
  if (!h.ok()) {
    return transport_error(h.status());
  }
  s->handoff_ = *std::move(h);
  if (auto allocate = s->handoff_->PoolAllocator()) {
    runtime_config.pool_allocator =
        [allocate](size_t bytes) -> absl::StatusOr<memory::ExternalPoolMemory> {
      PD_ASSIGN_OR_RETURN(std::shared_ptr<transport::HostAllocation> a, allocate(bytes));
      memory::ExternalPoolMemory m;
      m.base = static_cast<uint8_t*>(a->data());
      m.size = a->size();
      m.description = a->Describe();
      m.owner = std::move(a);
      return m;
    };
  }
  PD_ASSIGN_OR_RETURN(s->runtime_, engine::ModelRuntime::Create(runtime_config));
  ctx.runtime = s->runtime_.get();
  ctx.layout = services::LayoutToProto(s->runtime_->kv_layout(), s->runtime_->fingerprint());
  memory::KvPoolMemory* pool = s->runtime_->kv_memory();
  PD_ASSIGN_OR_RETURN(transport::PoolGeometry geometry,
                      disagg::GeometryFor(s->runtime_->kv_layout(), s->runtime_->fingerprint(),
                                          s->runtime_->kv_blocks()));
  if (pool->base() == nullptr) {
    // Per-rank pools: blocks leave and arrive through a staging area in the TP = 1 layout.
    const int64_t staging =
        config.kv_staging_blocks > 0
            ? config.kv_staging_blocks
            : StagingBlocksFor(s->runtime_->kv_blocks(), runtime_config.block_size,
                               s->runtime_->model_config().seq_len);
    if (absl::Status r = s->handoff_->RegisterStagedPool(pool, staging, geometry); !r.ok()) {
      return transport_error(
          absl::Status(r.code(), absl::StrCat("the KV hand-off's staging area of ", staging,
                                              " blocks (--kv_staging_blocks): ", r.message())));
    }
    LOG(INFO) << "kv hand-off through a staging area of " << staging << " blocks ("
              << ((staging * s->runtime_->kv_layout().block_bytes()) >> 20)
              << " MiB): the KV pool is per rank";
  } else if (absl::Status r = s->handoff_->RegisterPool(pool->base(), pool->size_bytes(), geometry);
             !r.ok()) {
    return transport_error(r);
  }
  ctx.handoff = s->handoff_.get();

  engine::EngineLoop::Options loop_options;
  loop_options.step_delay = config.step_delay;
  s->loop_ = std::make_unique<engine::EngineLoop>(s->runtime_->scheduler(), loop_options);
  ctx.loop = s->loop_.get();
  s->decode_ = std::make_unique<DecodeServiceImpl>(&ctx);
  s->prefill_ = std::make_unique<PrefillServiceImpl>(&ctx);

  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  builder.AddListeningPort(config.grpc_address.ToString(), server_credentials, &s->port_);
  builder.SetMaxReceiveMessageSize(64 << 20);
  if (config.role != WorkerRole::kPrefill) {
    builder.RegisterService(s->decode_.get());
  }
  if (config.role != WorkerRole::kDecode) {
    builder.RegisterService(s->prefill_.get());
  }
  builder.RegisterService(s->kv_events_.get());  // every role holds KV blocks
  s->server_ = builder.BuildAndStart();
  if (s->server_ == nullptr || s->port_ == 0) {
    return absl::UnavailableError(
        absl::StrCat("--grpc_address ", config.grpc_address.ToString(), ": cannot start server"));
  }
  ctx.grpc_address = services::HostPort{config.grpc_address.host, s->port_}.ToString();
  ctx.worker_id = config.worker_id.empty() ? ctx.grpc_address : config.worker_id;
  s->kv_events_->SetWorkerId(ctx.worker_id);
  ctx.node_name = config.node_name.empty() ? services::HostName() : config.node_name;
  if (!config.tierd_address.empty()) {
    tier_client::TierClientConfig tc;
    tc.tierd_address = config.tierd_address;
    tc.worker_id = ctx.worker_id;
    tc.node_name = ctx.node_name;
    // Evicted blocks copied once, straight into a reserved DRAM slot: the GPU default (by
    // cudaMemcpyAsync into the page-locked mapping); see WorkerConfig::tier_offer_slots.
    tc.unbound_slots = config.tier_offer_slots >= 0 ? config.tier_offer_slots
                       : s->runtime_->kv_memory()->device() == kernels::Device::kCuda ? 16
                                                                                      : 0;
    tc.layout = ctx.layout;
    tc.security = ctx.peer_security;
    if (pool->device() == kernels::Device::kCuda) {
      // Restores copy tierd's shared memory straight into device blocks: page-lock each mapping
      // so cudaMemcpyAsync DMAs from it. Unpinned still works (CUDA stages pageable memory).
      tc.on_map = [](uint8_t* data, size_t size_bytes) -> absl::AnyInvocable<void()> {
        absl::StatusOr<kernels::HostRegistration> pin = kernels::HostRegistration::Register(
            kernels::Device::kCuda, data, static_cast<int64_t>(size_bytes));
        if (!pin.ok()) {
          LOG(WARNING) << "tier pool mapping of " << size_bytes
                       << " bytes not page-locked for the GPU (restores use pageable copies): "
                       << pin.status();
          return nullptr;
        }
        return [pin = *std::move(pin)]() mutable { pin = kernels::HostRegistration(); };
      };
    }
    absl::StatusOr<std::unique_ptr<tier_client::TierClient>> tiers =
        tier_client::TierClient::Start(tc);
    if (!tiers.ok()) {
      return absl::Status(
          tiers.status().code(),
          absl::StrCat("--tierd_address ", config.tierd_address, ": ", tiers.status().message()));
    }
    s->tiers_ = *std::move(tiers);
    s->tier_slot_->store(s->tiers_.get(), std::memory_order_release);
    ctx.tiers = s->tiers_.get();
    ctx.local_blocks = s->local_blocks_.get();
  }
  engine::EngineLoop* loop = s->loop_.get();
  kv_events::KvEventPublisher* publisher = s->kv_events_.get();
  tier_client::TierLink* tiers = s->tiers_.get();
  disagg::KvHandoff* handoff_ptr = s->handoff_.get();
  s->collector_ = metrics->AddCollector([loop, publisher, tiers,
                                         handoff = handoff_ptr](metrics::CollectorSink& sink) {
    if (tiers != nullptr) {
      const tier_client::TierLinkStats t = tiers->Stats();
      sink.AddGauge("pd_worker_tierd_attached", "1 while attached to the node's pd-tierd",
                    t.attached ? 1 : 0);
      sink.AddGauge("pd_worker_tierd_node_mismatch",
                    "1 while the attached pd-tierd names another node than this worker's "
                    "--node_name (its blocks get no routing credit for this worker)",
                    t.node_mismatch ? 1 : 0);
      sink.AddCounter("pd_worker_tier_offered_blocks_total",
                      "Evicted blocks offered to the node's DRAM tier, by outcome",
                      static_cast<double>(t.offer_stored_blocks_total), {{"outcome", "stored"}});
      sink.AddCounter("pd_worker_tier_offered_blocks_total",
                      "Evicted blocks offered to the node's DRAM tier, by outcome",
                      static_cast<double>(t.offer_skipped_blocks_total), {{"outcome", "held"}});
      sink.AddCounter("pd_worker_tier_offered_blocks_total",
                      "Evicted blocks offered to the node's DRAM tier, by outcome",
                      static_cast<double>(t.offer_dropped_blocks_total), {{"outcome", "dropped"}});
      sink.AddCounter("pd_worker_tier_offered_in_place_blocks_total",
                      "Evicted blocks copied straight into a reserved slot of the node's DRAM "
                      "tier (no staging copy)",
                      static_cast<double>(t.offered_in_place_blocks_total));
      sink.AddCounter("pd_worker_tier_promoted_blocks_total",
                      "Blocks the node's tiers made readable for prompts, by source tier",
                      static_cast<double>(t.promoted_blocks_total - t.promoted_from_nvme_total),
                      {{"tier", "dram"}});
      sink.AddCounter("pd_worker_tier_promoted_blocks_total",
                      "Blocks the node's tiers made readable for prompts, by source tier",
                      static_cast<double>(t.promoted_from_nvme_total), {{"tier", "nvme"}});
      sink.AddCounter("pd_worker_tier_checksum_failures_total",
                      "Tier blocks whose copy failed verification (recomputed instead)",
                      static_cast<double>(t.checksum_failures_total));
      sink.AddCounter("pd_worker_tier_rpc_failures_total", "Failed calls to pd-tierd",
                      static_cast<double>(t.rpc_failures_total));
    }
    const kv_events::KvEventPublisherStats ev = publisher->Stats();
    sink.AddCounter("pd_worker_kv_events_total", "KV events published (stored, removed, cleared)",
                    static_cast<double>(ev.events_published));
    sink.AddGauge("pd_worker_kv_event_subscribers", "Open KV event streams (routers)",
                  static_cast<double>(ev.subscribers));
    sink.AddCounter("pd_worker_kv_event_snapshots_total",
                    "KV event streams that started with a snapshot instead of a replay",
                    static_cast<double>(ev.snapshots_sent));
    const engine::SchedulerStats st = loop->Stats();
    sink.AddGauge("pd_worker_requests_waiting", "Requests queued for admission", st.waiting);
    sink.AddGauge("pd_worker_requests_running", "Requests in the running set", st.running);
    sink.AddGauge("pd_worker_remote_prefills_pending",
                  "Decode requests waiting for a prefill worker", st.remote_prefills);
    sink.AddGauge("pd_worker_prefilled_held",
                  "Prefill requests holding blocks while their KV is sent", st.held);
    sink.AddGauge("pd_worker_queued_prefill_tokens", "Prompt tokens not yet computed",
                  st.pending_prefill_tokens);
    sink.AddGauge("pd_worker_kv_blocks", "KV pool blocks by state", st.kv.num_blocks_used,
                  {{"state", "used"}});
    sink.AddGauge("pd_worker_kv_blocks", "KV pool blocks by state", st.kv.num_blocks_cached,
                  {{"state", "cached"}});
    sink.AddGauge("pd_worker_kv_blocks", "KV pool blocks by state", st.kv.num_blocks_free,
                  {{"state", "free"}});
    sink.AddCounter("pd_worker_prefix_query_tokens_total",
                    "Prompt tokens looked up in the prefix cache", st.kv.prefix_query_tokens);
    sink.AddCounter("pd_worker_prefix_hit_tokens_total", "Prompt tokens found in the prefix cache",
                    st.kv.prefix_hit_tokens);
    sink.AddCounter("pd_worker_kv_evictions_total", "Cached blocks evicted for reuse",
                    st.kv.evictions);
    sink.AddCounter("pd_worker_preemptions_total", "Requests preempted (recompute)",
                    st.preemptions);
    sink.AddCounter("pd_worker_kv_window_dropped_blocks_total",
                    "KV blocks dropped by the sink + window policy (--kv_window_tokens)",
                    st.window_dropped_blocks);
    sink.AddCounter("pd_worker_kv_compactions_total", "H2O / SnapKV compactions (--kv_policy)",
                    st.kv_compactions);
    sink.AddCounter("pd_worker_kv_evicted_tokens_total",
                    "Cached tokens evicted by H2O / SnapKV (--kv_policy)", st.kv_evicted_tokens);
    for (const auto& [source, n] :
         {std::pair<const char*, int64_t>{"allocated", st.score_buffers_allocated},
          {"reused", st.score_buffers_reused}}) {
      sink.AddCounter("pd_worker_kv_score_buffers_total",
                      "H2O / SnapKV on the device: score buffers of governed sequences, newly "
                      "allocated or taken again from the pool",
                      static_cast<double>(n), {{"source", source}});
    }
    sink.AddCounter("pd_worker_spec_proposed_tokens_total",
                    "Speculative decoding: tokens proposed (--speculative)",
                    st.spec_proposed_tokens);
    sink.AddCounter("pd_worker_spec_accepted_tokens_total",
                    "Speculative decoding: proposed tokens accepted (each a decode step saved)",
                    st.spec_accepted_tokens);
    sink.AddCounter("pd_worker_spec_verify_steps_total",
                    "Speculative decoding: sequence-steps that verified a proposal",
                    st.spec_verify_steps);
    sink.AddCounter("pd_worker_spec_declined_steps_total",
                    "Speculative decoding: steps whose measured costs said proposals do not pay",
                    st.spec_declined_steps);
    sink.AddCounter("pd_worker_draft_forward_passes_total",
                    "Speculative decoding with a draft model: the draft's forward passes",
                    st.draft_forward_passes);
    sink.AddCounter("pd_worker_draft_catch_up_tokens_total",
                    "Speculative decoding with a draft model: tokens the draft computed to catch "
                    "up with its sequences (prompts, then the tokens the model took)",
                    st.draft_catch_up_tokens);
    sink.AddCounter("pd_worker_draft_evictions_total",
                    "Speculative decoding with a draft model: sequences whose draft KV blocks "
                    "went to others (--draft_kv_blocks short)",
                    st.draft_evictions);
    sink.AddGauge("pd_worker_draft_free_blocks", "Free blocks of the draft model's KV pool",
                  st.draft_free_blocks);
    sink.AddCounter("pd_worker_late_masks_total",
                    "Steps a sequence sat out because its structured-output mask was late "
                    "(--mask_grace_ms)",
                    st.late_masks);
    sink.AddCounter("pd_worker_late_verify_masks_total",
                    "Speculative proposals cut short because a verify row's structured-output "
                    "mask was late",
                    st.late_verify_masks);
    sink.AddCounter("pd_worker_prefill_tokens_total", "Prompt tokens computed here",
                    st.prefill_tokens);
    sink.AddCounter("pd_worker_tier_restored_blocks_total",
                    "Blocks restored into the pool from the node's tiers instead of computed",
                    st.tier_restored_blocks);
    for (const auto& [source, tokens] :
         {std::pair<const char*, int64_t>{"pool", st.resumed_pool_tokens},
          {"tier", st.resumed_tier_tokens},
          {"computed", st.resumed_computed_tokens}}) {
      sink.AddCounter("pd_worker_resumed_tokens_total",
                      "Tokens of moved streams' resumed prompts (prompt + streamed tokens) by "
                      "where their KV came from: pool, tier (restored), computed",
                      tokens, {{"source", source}});
    }
    sink.AddCounter("pd_worker_decode_tokens_total", "Tokens sampled here", st.decode_tokens);
    sink.AddCounter("pd_worker_decode_graph_replays_total",
                    "Decode steps run as one CUDA graph launch", st.decode_graph_replays);
    sink.AddCounter("pd_worker_decode_graph_captures_total",
                    "Decode step shapes captured as CUDA graphs", st.decode_graph_captures);
    sink.AddGauge("pd_worker_decode_graphs_disabled",
                  "1 when a CUDA graph capture failed and decode steps launch kernel by kernel",
                  st.decode_graphs_off ? 1 : 0);
    if (handoff->staged()) {
      const disagg::KvHandoff::StagingStats hs = handoff->staging_stats();
      sink.AddGauge("pd_worker_kv_staging_blocks",
                    "Per-rank pools: blocks of the KV hand-off's staging area by state",
                    hs.free_blocks, {{"state", "free"}});
      sink.AddGauge("pd_worker_kv_staging_blocks",
                    "Per-rank pools: blocks of the KV hand-off's staging area by state",
                    hs.blocks - hs.free_blocks, {{"state", "used"}});
      for (const auto& [dir, blocks, seconds] :
           {std::tuple<const char*, int64_t, double>{"out", hs.blocks_out, hs.seconds_out},
            {"in", hs.blocks_in, hs.seconds_in}}) {
        sink.AddCounter("pd_worker_kv_staging_copied_blocks_total",
                        "Per-rank pools: blocks copied between the ranks and the staging area "
                        "(out: gathered to send, in: scattered on arrival)",
                        static_cast<double>(blocks), {{"direction", dir}});
        sink.AddCounter("pd_worker_kv_staging_copy_seconds_total",
                        "Per-rank pools: time those copies took", seconds, {{"direction", dir}});
      }
      sink.AddCounter("pd_worker_kv_staging_refused_total",
                      "Per-rank pools: transfers refused for want of free staging blocks (the "
                      "decode side then prefills locally)",
                      static_cast<double>(hs.refused));
    }
    if (!st.tp_wait_nanos.empty()) {
      sink.AddGauge("pd_worker_tensor_parallel_ranks",
                    "Ranks the model is split over (--tensor_parallel)",
                    static_cast<double>(st.tp_wait_nanos.size()));
      for (size_t r = 0; r < st.tp_wait_nanos.size(); ++r) {
        sink.AddCounter("pd_worker_tp_collective_wait_seconds_total",
                        "Tensor parallelism: time each rank waited for its peers in collectives "
                        "(all-reduce, all-gather); a rank far above the others is the busy one",
                        static_cast<double>(st.tp_wait_nanos[r]) * 1e-9,
                        {{"rank", absl::StrCat(r)}});
      }
    }
    if (st.moe_experts > 0) {
      // Expert load: assignments per layer and expert, and the most loaded expert's share
      // against an even spread (1 = balanced; n_experts = one expert takes everything).
      double max_ratio = 0;
      const auto experts = static_cast<size_t>(st.moe_experts);
      for (size_t l = 0; l * experts < st.moe_expert_tokens.size(); ++l) {
        int64_t total = 0, most = 0;
        for (size_t e = 0; e < experts; ++e) {
          const int64_t n = st.moe_expert_tokens[l * experts + e];
          sink.AddCounter("pd_worker_moe_expert_tokens_total",
                          "Mixture of experts: tokens routed to each expert of each layer", n,
                          {{"layer", absl::StrCat(l)}, {"expert", absl::StrCat(e)}});
          total += n;
          most = std::max(most, n);
        }
        if (total > 0) {
          max_ratio = std::max(max_ratio, static_cast<double>(most) * static_cast<double>(experts) /
                                              static_cast<double>(total));
        }
      }
      sink.AddGauge("pd_worker_moe_expert_load_max_ratio",
                    "Mixture of experts: the most loaded expert's tokens over the mean per expert, "
                    "worst layer, since start (1 = balanced)",
                    max_ratio);
    }
    sink.AddCounter("pd_worker_remote_prefill_failures_total",
                    "Remote prefills that failed (decode then prefilled locally)",
                    st.remote_prefill_failures);
  });
  s->server_->GetHealthCheckService()->SetServingStatus(true);
  // Once started: a startup error stays one line.
  if (config.cluster_token_file.empty()) {
    services::WarnUnauthenticatedInternalRpcs(
        "pd-worker",
        "anyone who can reach it can run generations bypassing the router's API keys and limits, "
        "subscribe to its KV events (every cached prompt's block hashes) and ask it to prefill "
        "into another worker's pool");
  }
  return s;
}

WorkerServer::~WorkerServer() {
  Drain(absl::ZeroDuration());
  if (registry_ != nullptr) {
    registry_->RemoveCollector(collector_);
  }
}

std::string WorkerServer::address() const { return ctx_.grpc_address; }

std::string WorkerServer::Describe() const {
  return absl::StrCat(
      "worker ", ctx_.worker_id, " role ", RoleName(ctx_.config.role), " on ", ctx_.grpc_address,
      ctx_.config.tls.enabled() ? (ctx_.config.tls.client_ca_file.empty() ? " (tls)" : " (mtls)")
                                : " (plaintext)",
      ctx_.cluster_auth.enabled() ? ", cluster token on" : "", ", ", runtime_->Describe(),
      ", transport ", handoff_->backend(),
      tiers_ != nullptr ? absl::StrCat(", tierd ", ctx_.config.tierd_address)
                        : std::string(", no tierd"));
}

void WorkerServer::OfferRunningBlocksToTiers() {
  if (tiers_ == nullptr || ctx_.config.tier_write_through) {
    return;  // no tiers, or every computed block is there already
  }
  // The running streams' blocks go to the node's tiers before the streams are handed over, so
  // the workers they move to restore them rather than compute them again. Bounded: staging
  // drops what does not fit, and the flush waits at most kFlushBound.
  constexpr absl::Duration kFlushBound = absl::Seconds(1);
  const absl::Time start = absl::Now();
  const tier_client::TierLinkStats before = tiers_->Stats();
  struct Offered {
    absl::Notification done;
    int64_t blocks = 0;
  };
  auto offered = std::make_shared<Offered>();
  loop_->Post([rt = runtime_.get(), offered](engine::Scheduler&) {
    offered->blocks = rt->OfferRunningBlocks();
    offered->done.Notify();
  });
  if (!offered->done.WaitForNotificationWithTimeout(kFlushBound)) {
    LOG(WARNING) << "drain: the engine did not offer its running blocks within " << kFlushBound;
    return;
  }
  const bool flushed = tiers_->FlushOffers(kFlushBound - (absl::Now() - start));
  const tier_client::TierLinkStats after = tiers_->Stats();
  LOG(INFO) << "drain: offered the running streams' " << offered->blocks
            << " blocks to the tiers in " << absl::Now() - start << " (streams sharing blocks "
            << "offer them once; "
            << after.offer_stored_blocks_total - before.offer_stored_blocks_total << " stored, "
            << after.offer_skipped_blocks_total - before.offer_skipped_blocks_total
            << " already held, "
            << after.offer_dropped_blocks_total - before.offer_dropped_blocks_total << " dropped"
            << (flushed ? "" : ", not all sent in time") << ")";
}

void WorkerServer::Drain(absl::Duration timeout) {
  if (kv_events_ != nullptr) {
    // First: its streams never end by themselves, and Server::Shutdown would wait for them.
    kv_events_->Shutdown();
  }
  if (server_ != nullptr) {
    server_->GetHealthCheckService()->SetServingStatus(false);
    if (ctx_.config.drain_by_migration && loop_ != nullptr) {
      OfferRunningBlocksToTiers();
      // Streams end now, with what was generated sent; the router resumes each elsewhere.
      loop_->Post([](engine::Scheduler& s) {
        s.Evacuate(absl::UnavailableError(
            absl::StrCat(services::kWorkerDrainingMessage,
                         " (SIGTERM): the router moves this stream to another decode worker")));
      });
    }
    server_->Shutdown(absl::ToChronoTime(absl::Now() + timeout));
    server_->Wait();
    server_.reset();
  }
  if (loop_ != nullptr) {
    loop_->Stop();
  }
  handoff_.reset();  // fails what still waits for a transfer
  loop_.reset();
  if (tier_slot_ != nullptr) {
    tier_slot_->store(nullptr, std::memory_order_release);
  }
  tiers_.reset();  // after the loop: tier prefixes of queued requests were released
}

}  // namespace pd::worker
