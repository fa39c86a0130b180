#include "services/router/generation_service.h"

#include <grpcpp/grpcpp.h>

#include <optional>
#include <random>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/base/status_macros.h"
#include "common/log/log.h"
#include "services/base/grpc_status.h"

namespace pd::router {
namespace {

namespace iv1 = pdserve::internal::v1;
namespace v1 = pdserve::v1;

const std::vector<double>& LatencyBuckets() {
  static const std::vector<double> b = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                                        0.5,   1,      2.5,   5,    10,    30,   60};
  return b;
}

// Ends a server stream at once with `status` (no messages).
class FinishedWriter final : public grpc::ServerWriteReactor<v1::GenerateResponse> {
 public:
  explicit FinishedWriter(const grpc::Status& status) { Finish(status); }
  void OnDone() override { delete this; }  // gRPC's reactor ownership contract
};

// One client stream relayed from a DecodeService.Generate call, in lockstep: read one worker
// message, write it to the client, read the next. Finishes the client stream once the worker
// call is done (its status is the outcome). Deletes itself when both are done.
//
// A decode worker that fails with UNAVAILABLE before anything was relayed to the client (it
// died, or was unreachable) is retried once on another placement: the request is the same
// (same seed), so the output is what the first worker would have produced.
class RouterStream final : public grpc::ServerWriteReactor<v1::GenerateResponse> {
 public:
  static constexpr int kMaxAttempts = 2;

  RouterStream(GenerationService* service, grpc::CallbackServerContext* server_ctx,
               iv1::DecodeRequest decode, Placement placement, absl::Time deadline)
      : service_(service), decode_(std::move(decode)), deadline_(deadline),
        received_(absl::Now()) {
    (void)server_ctx;
    Attempt* a;
    {
      absl::MutexLock lock(&mu_);
      a = NewAttemptLocked(std::move(placement));
    }
    Launch(a);
  }

  void OnWriteDone(bool ok) override {
    std::optional<grpc::Status> finish;
    Attempt* cancel = nullptr;
    {
      absl::MutexLock lock(&mu_);
      writing_ = false;
      if (!ok) {
        cancelled_by_client_ = true;
        cancel = attempt_.get();  // the client is gone: stop the worker
      } else if (!upstream_done_) {
        attempt_->upstream.StartRead(&attempt_->in);
      }
      finish = MaybeFinishLocked();
    }
    if (cancel != nullptr) {
      cancel->ctx.TryCancel();
      cancel->upstream.RemoveHold();  // no read will follow (see Launch)
    }
    // Outside the lock: OnDone (which deletes this) may run as soon as Finish is called.
    if (finish.has_value()) Finish(*finish);
  }

  void OnCancel() override {
    Attempt* attempt;
    {
      absl::MutexLock lock(&mu_);
      cancelled_by_client_ = true;
      attempt = attempt_.get();
    }
    attempt->ctx.TryCancel();  // attempts live as long as this stream
  }

  void OnDone() override {
    bool release;
    {
      absl::MutexLock lock(&mu_);
      release = !tenant_released_;  // normally released by MaybeFinishLocked already
      tenant_released_ = true;
    }
    if (release) service_->ReleaseStream(decode_.tenant());
    delete this;
  }

 private:
  // One DecodeService.Generate call.
  struct Attempt;
  class Upstream final : public grpc::ClientReadReactor<iv1::DecodeResponse> {
   public:
    Upstream(RouterStream* s, Attempt* a) : s_(s), a_(a) {}
    void OnReadDone(bool ok) override { s_->OnUpstreamRead(a_, ok); }
    void OnDone(const grpc::Status& status) override { s_->OnUpstreamDone(a_, status); }

   private:
    RouterStream* s_;
    Attempt* a_;
  };
  struct Attempt {
    Attempt(RouterStream* s, Placement p) : placement(std::move(p)), upstream(s, this) {}
    const Placement placement;
    grpc::ClientContext ctx;
    Upstream upstream;
    iv1::DecodeResponse in;
  };

  // Makes `placement` the current attempt; Launch (outside mu_: gRPC may run a reaction
  // inline) then starts its call.
  Attempt* NewAttemptLocked(Placement placement) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    WorkerPool* pool = service_->workers();
    pool->AddInflight(placement.decode_index, 1, placement.new_blocks);
    if (placement.prefill_index >= 0) {
      pool->AddInflight(placement.prefill_index, 1);
    }
    if (attempt_ != nullptr) {
      retired_.push_back(std::move(attempt_));
    }
    attempt_ = std::make_unique<Attempt>(this, std::move(placement));
    Attempt& a = *attempt_;
    if (deadline_ != absl::InfiniteFuture()) {
      a.ctx.set_deadline(absl::ToChronoTime(deadline_));
    }
    ++attempts_;
    upstream_done_ = false;
    return &a;
  }

  // `decode_` is not changed while a call is in flight, so it is read here without mu_.
  void Launch(Attempt* a) {
    service_->workers()
        ->decode_stub(a->placement.decode_index)
        ->async()
        ->Generate(&a->ctx, &decode_, &a->upstream);
    // The next read is started from OnWriteDone, outside the upstream's reactions: without a
    // hold, the call could finish (and free its state) between a read's end and that StartRead.
    // Released when no read will follow: a read that ends the stream, or a failed client write.
    a->upstream.AddHold();
    a->upstream.StartRead(&a->in);
    a->upstream.StartCall();
  }

  void EndAttemptLocked(const Attempt& a) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    WorkerPool* pool = service_->workers();
    pool->AddInflight(a.placement.decode_index, -1, a.placement.new_blocks);
    if (a.placement.prefill_index >= 0) {
      pool->AddInflight(a.placement.prefill_index, -1);
    }
  }

  void OnUpstreamRead(Attempt* a, bool ok) {
    if (!ok) {
      // End of stream: OnDone follows with the status. Before the final message it may also
      // be a message that failed to parse; gRPC then delivers the status only after every
      // remaining message was read, which never happens: cancel so OnDone comes.
      bool cancel = false;
      {
        absl::MutexLock lock(&mu_);
        cancel = read_failed_ = !got_final_;
      }
      if (cancel) a->ctx.TryCancel();
      a->upstream.RemoveHold();  // no read follows: OnDone may come
      return;
    }
    absl::MutexLock lock(&mu_);
    const iv1::DecodeResponse& in = a->in;
    out_.Clear();
    *out_.mutable_token_ids() = in.token_ids();
    out_.set_text(in.text());
    completion_tokens_ += in.token_ids_size();
    if (in.token_ids_size() > 0) {
      const absl::Time now = absl::Now();
      if (!first_) {
        // Inter-token latency as the client sees it: one observation per message after the
        // first, spread over the tokens it carries.
        const double gap = absl::ToDoubleSeconds(now - last_token_) / in.token_ids_size();
        metrics::Histogram& itl = service_->metrics().itl->WithLabels({});
        for (int i = 0; i < in.token_ids_size(); ++i) itl.Observe(gap);
      }
      last_token_ = now;
    }
    if (first_) {
      out_.set_request_id(decode_.request_id());
      if (in.token_ids_size() > 0) {
        first_token_ = last_token_;
        first_ = false;
      }
    }
    if (in.finish_reason() != v1::FINISH_REASON_UNSPECIFIED) {
      out_.set_request_id(decode_.request_id());
      out_.set_finish_reason(in.finish_reason());
      *out_.mutable_usage() = in.usage();
      v1::Timings* t = out_.mutable_timings();
      *t = in.timings();
      const absl::Time now = absl::Now();
      // Router-side times include routing and the hop to the worker.
      t->set_total_us(absl::ToInt64Microseconds(now - received_));
      if (first_token_ != absl::InfinitePast()) {
        t->set_first_token_us(absl::ToInt64Microseconds(first_token_ - received_));
      }
      got_final_ = true;
      usage_ = in.usage();
    }
    relayed_ = true;
    writing_ = true;
    StartWrite(&out_);
  }

  void OnUpstreamDone(Attempt* a, const grpc::Status& status) {
    std::optional<grpc::Status> finish;
    Attempt* retry = nullptr;
    {
      absl::MutexLock lock(&mu_);
      EndAttemptLocked(*a);
      if (status.error_code() == grpc::StatusCode::UNAVAILABLE) {
        // The worker died or is unreachable: no new requests until it answers health checks.
        service_->workers()->MarkFailed(a->placement.decode_index,
                                        services::FromGrpcStatus(status));
        if (!relayed_ && !cancelled_by_client_ && attempts_ < kMaxAttempts &&
            absl::Now() < deadline_) {
          retry = Retry(status);
        }
      }
    }
    if (retry != nullptr) {
      Launch(retry);
      return;
    }
    {
      absl::MutexLock lock(&mu_);
      upstream_done_ = true;
      status_ = status;
      if (read_failed_ && status.error_code() == grpc::StatusCode::CANCELLED &&
          !cancelled_by_client_) {
        status_ = grpc::Status(grpc::StatusCode::INTERNAL,
                               "decode worker sent a message the router cannot read");
      }
      finish = MaybeFinishLocked();
    }
    if (finish.has_value()) Finish(*finish);
  }

  // Places the request again (the failed worker is out of the pool now): the new attempt to
  // Launch, or null when no worker can take it.
  Attempt* Retry(const grpc::Status& why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    std::vector<BlockHash> chain;
    const std::string& bytes = decode_.block_hashes();
    for (size_t i = 0; i + 16 <= bytes.size(); i += 16) {
      absl::StatusOr<BlockHash> h = BlockHash::FromBytes(absl::string_view(bytes).substr(i, 16));
      if (!h.ok()) return nullptr;
      chain.push_back(*h);
    }
    std::vector<WorkerSnapshot> workers = service_->workers()->Snapshot();
    absl::StatusOr<Placement> p =
        service_->policy()->Choose(chain, decode_.token_ids_size(), workers);
    if (!p.ok()) {
      return nullptr;
    }
    if (p->prefill_index >= 0) {
      decode_.set_prefill_address(workers[p->prefill_index].address);
    } else {
      decode_.clear_prefill_address();
    }
    LOG(WARNING) << "request_id=" << decode_.request_id() << ": decode worker failed before "
                 << "the first token (" << why.error_message() << "); retrying on worker "
                 << p->decode_index;
    service_->metrics().retries->WithLabels({}).Increment();
    return NewAttemptLocked(*std::move(p));
  }

  // The status to Finish the client stream with, once the worker call is done and no write is
  // in flight; nullopt otherwise (and after it was returned once).
  std::optional<grpc::Status> MaybeFinishLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!upstream_done_ || writing_ || finished_) {
      return std::nullopt;
    }
    finished_ = true;
    if (!tenant_released_) {
      tenant_released_ = true;
      service_->ReleaseStream(decode_.tenant());  // before the client sees the end
    }
    grpc::Status final_status = status_;
    if (status_.ok() && !got_final_) {
      final_status = grpc::Status(grpc::StatusCode::INTERNAL,
                                  "decode worker ended the stream without a finish reason");
    }
    if (status_.error_code() == grpc::StatusCode::UNAVAILABLE) {
      final_status =
          grpc::Status(grpc::StatusCode::UNAVAILABLE,
                       absl::StrCat("decode worker failed: ", status_.error_message(), " (retry)"));
    }
    const GenerationService::Metrics& m = service_->metrics();
    if (final_status.ok()) {
      const absl::Time now = absl::Now();
      if (first_token_ != absl::InfinitePast()) {
        m.ttft->WithLabels({}).Observe(absl::ToDoubleSeconds(first_token_ - received_));
        if (completion_tokens_ > 1) {
          m.tpot->WithLabels({}).Observe(absl::ToDoubleSeconds(now - first_token_) /
                                         (completion_tokens_ - 1));
        }
      }
      m.e2e->WithLabels({}).Observe(absl::ToDoubleSeconds(now - received_));
      m.tokens->WithLabels({"prompt"}).Increment(usage_.prompt_tokens());
      m.tokens->WithLabels({"cached"}).Increment(usage_.cached_tokens());
      m.tokens->WithLabels({"generated"}).Increment(usage_.completion_tokens());
    }
    service_->Count("Generate", static_cast<absl::StatusCode>(final_status.error_code()));
    VLOG(1) << "request_id=" << decode_.request_id() << " done: " << final_status.error_message();
    return final_status;
  }

  GenerationService* const service_;
  iv1::DecodeRequest decode_;  // changed only between attempts (prefill_address)
  const absl::Time deadline_;
  const absl::Time received_;
  absl::Mutex mu_;
  std::unique_ptr<Attempt> attempt_ ABSL_GUARDED_BY(mu_);
  // Finished attempts: kept until the stream is deleted, as OnCancel may still name one.
  std::vector<std::unique_ptr<Attempt>> retired_ ABSL_GUARDED_BY(mu_);
  int attempts_ ABSL_GUARDED_BY(mu_) = 0;
  v1::GenerateResponse out_ ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool relayed_ ABSL_GUARDED_BY(mu_) = false;  // something was written to the client
  bool upstream_done_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  bool tenant_released_ ABSL_GUARDED_BY(mu_) = false;
  bool first_ ABSL_GUARDED_BY(mu_) = true;
  bool got_final_ ABSL_GUARDED_BY(mu_) = false;
  bool read_failed_ ABSL_GUARDED_BY(mu_) = false;
  bool cancelled_by_client_ ABSL_GUARDED_BY(mu_) = false;
  int64_t completion_tokens_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Time first_token_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  absl::Time last_token_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  v1::Usage usage_ ABSL_GUARDED_BY(mu_);
  grpc::Status status_ ABSL_GUARDED_BY(mu_);
};

std::string BaseName(const std::string& path) {
  std::string p = path;
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  const size_t slash = p.rfind('/');
  return slash == std::string::npos ? p : p.substr(slash + 1);
}

}  // namespace

absl::StatusOr<std::unique_ptr<GenerationService>> GenerationService::Create(
    const RouterConfig& config, const engine::ModelFront* model, WorkerPool* workers,
    PlacementPolicy* policy, metrics::Registry* r, std::optional<services::ApiKeyStore> api_keys) {
  PD_RETURN_IF_ERROR(config.limits.Validate());
  std::unique_ptr<GenerationService> s(new GenerationService());
  s->config_ = config;
  s->api_keys_ = std::move(api_keys);
  s->model_ = model;
  s->workers_ = workers;
  s->policy_ = policy;
  s->model_id_ = config.model_id.empty() ? BaseName(config.model) : config.model_id;
  Metrics& m = s->metrics_;
  PD_ASSIGN_OR_RETURN(m.requests, r->AddCounter("pd_router_requests_total",
                                                "Public API calls by method and final gRPC "
                                                "status code",
                                                {"method", "code"}));
  PD_ASSIGN_OR_RETURN(m.routing,
                      r->AddCounter("pd_router_routing_decisions_total",
                                    "Placements by policy and reason", {"policy", "reason"}));
  PD_ASSIGN_OR_RETURN(m.retries,
                      r->AddCounter("pd_router_retries_total",
                                    "Requests placed again after their decode worker failed "
                                    "before the first token",
                                    {}));
  PD_ASSIGN_OR_RETURN(m.prefill_placement,
                      r->AddCounter("pd_router_prefill_placements_total",
                                    "Where prompts were prefilled: remote_prefill, "
                                    "below_disagg_threshold, no_prefill_worker",
                                    {"placement"}));
  PD_ASSIGN_OR_RETURN(m.routed_cached_blocks,
                      r->AddCounter("pd_router_routed_cached_blocks_total",
                                    "Prompt blocks the chosen decode worker held (per the KV "
                                    "index) when the request was placed",
                                    {}));
  PD_ASSIGN_OR_RETURN(
      m.ttft, r->AddHistogram("pd_router_ttft_seconds", "Request received to first token sent", {},
                              LatencyBuckets()));
  PD_ASSIGN_OR_RETURN(m.tpot, r->AddHistogram("pd_router_tpot_seconds",
                                              "Mean time per output token after the first, per "
                                              "request",
                                              {}, LatencyBuckets()));
  PD_ASSIGN_OR_RETURN(m.itl, r->AddHistogram("pd_router_itl_seconds",
                                             "Gap between consecutive output tokens as sent to "
                                             "the client (all gaps pooled)",
                                             {}, LatencyBuckets()));
  PD_ASSIGN_OR_RETURN(m.e2e, r->AddHistogram("pd_router_e2e_seconds",
                                             "Request received to stream end (successful "
                                             "requests)",
                                             {}, LatencyBuckets()));
  PD_ASSIGN_OR_RETURN(m.tokens, r->AddCounter("pd_router_tokens_total",
                                              "Tokens of successful requests by kind (prompt, "
                                              "cached, generated); cached/prompt = prefix hit "
                                              "ratio",
                                              {"kind"}));
  PD_ASSIGN_OR_RETURN(
      m.routing_latency,
      r->AddHistogram("pd_router_routing_seconds",
                      "Validation, tokenization, hashing and placement time", {},
                      {1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 5e-3, 0.01, 0.05}));
  return s;
}

void GenerationService::Count(absl::string_view method, absl::StatusCode code) {
  metrics_.requests->WithLabels({std::string(method), absl::StatusCodeToString(code)}).Increment();
}

absl::StatusOr<std::string> GenerationService::Authenticate(
    const grpc::CallbackServerContext& context, const v1::GenerateRequest* request) const {
  if (!api_keys_.has_value()) {
    return request != nullptr && request->has_tenant() ? request->tenant() : std::string();
  }
  PD_ASSIGN_OR_RETURN(std::string tenant, api_keys_->Authenticate(context));
  if (request != nullptr && request->has_tenant() && request->tenant() != tenant) {
    return absl::PermissionDeniedError(
        absl::StrCat("tenant '", request->tenant(), "' is not the api key's tenant"));
  }
  return tenant;
}

absl::Status GenerationService::AcquireStream(const std::string& tenant) {
  // Increment first, then check: two concurrent requests cannot both take the last slot.
  if (inflight_.fetch_add(1) >= config_.max_inflight) {
    --inflight_;
    return absl::ResourceExhaustedError(absl::StrCat(
        "router has ", config_.max_inflight, " streams open (--max_inflight); retry later"));
  }
  if (config_.max_streams_per_tenant <= 0) {
    return absl::OkStatus();
  }
  absl::MutexLock lock(&tenants_mu_);
  int64_t& open = tenant_streams_[tenant];
  if (open >= config_.max_streams_per_tenant) {  // open >= 1: the entry existed before
    --inflight_;
    return absl::ResourceExhaustedError(
        absl::StrCat("tenant '", tenant, "' has ", config_.max_streams_per_tenant,
                     " streams open (--max_streams_per_tenant); retry later"));
  }
  ++open;
  return absl::OkStatus();
}

void GenerationService::ReleaseStream(const std::string& tenant) {
  --inflight_;
  if (config_.max_streams_per_tenant <= 0) {
    return;
  }
  absl::MutexLock lock(&tenants_mu_);
  auto it = tenant_streams_.find(tenant);
  if (it != tenant_streams_.end() && --it->second <= 0) {
    tenant_streams_.erase(it);  // the map holds only tenants with open streams
  }
}

absl::StatusOr<BlockHash> GenerationService::SeedFor(const std::string& cache_salt) {
  absl::MutexLock lock(&seeds_mu_);
  auto it = seeds_.find(cache_salt);
  if (it != seeds_.end()) {
    return it->second;
  }
  // Salts come from clients: bound the cache (a miss costs one small hash).
  if (seeds_.size() >= 4096) {
    seeds_.clear();
  }
  HashSeedInput in;
  in.model_fingerprint = model_->fingerprint();
  in.kv_dtype = "f32";  // the workers' KV cache dtype (engine SchedulerConfig::kv_dtype)
  in.block_size = static_cast<uint32_t>(config_.block_size);
  in.cache_salt = cache_salt;
  PD_ASSIGN_OR_RETURN(BlockHash seed, ComputeHashSeed(in));
  seeds_.emplace(cache_salt, seed);
  return seed;
}

absl::Status GenerationService::Prepare(const v1::GenerateRequest& request,
                                        const std::string& tenant, iv1::DecodeRequest* decode,
                                        Placement* placement) {
  PD_RETURN_IF_ERROR(ValidateGenerateRequest(request, config_.limits));
  if (!request.model().empty() && request.model() != model_id_) {
    return absl::NotFoundError(absl::StrCat("unknown model '", request.model(),
                                            "'; this router serves '", model_id_, "'"));
  }
  const engine::ModelConfig& mc = model_->config();
  if (request.prompt_case() == v1::GenerateRequest::kText) {
    PD_ASSIGN_OR_RETURN(std::vector<uint32_t> ids,
                        model_->tokenizer().Encode(request.text(), model_->add_bos(), false));
    decode->mutable_token_ids()->Add(ids.begin(), ids.end());
  } else {
    for (int i = 0; i < request.token_ids().ids_size(); ++i) {
      const uint32_t t = request.token_ids().ids(i);
      if (t >= static_cast<uint32_t>(mc.vocab_size)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "token_ids[", i, "] = ", t, " is out of range: vocabulary size is ", mc.vocab_size));
      }
    }
    *decode->mutable_token_ids() = request.token_ids().ids();
  }
  const int64_t n = decode->token_ids_size();
  if (n == 0) {
    return absl::InvalidArgumentError("text: the prompt tokenizes to no tokens");
  }
  if (n >= mc.seq_len) {
    return absl::InvalidArgumentError(absl::StrCat(
        "prompt of ", n, " tokens does not fit the model's context of ", mc.seq_len, " tokens"));
  }
  for (uint32_t t : request.sampling().stop_token_ids()) {
    if (t >= static_cast<uint32_t>(mc.vocab_size)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "sampling.stop_token_ids: ", t, " is out of range: vocabulary size is ", mc.vocab_size));
    }
  }
  // With API keys the salt is bound to the authenticated tenant: no client salt can make one
  // tenant's block hashes equal another's. Without keys the client's salt is used as sent.
  std::string salt;
  if (api_keys_.has_value()) {
    salt = services::DeriveTenantCacheSalt(
        tenant,
        request.has_cache_salt() ? std::optional<std::string>(request.cache_salt()) : std::nullopt);
  } else if (request.has_cache_salt()) {
    salt = request.cache_salt();
  }
  PD_ASSIGN_OR_RETURN(BlockHash seed, SeedFor(salt));
  std::vector<uint32_t> tokens(decode->token_ids().begin(), decode->token_ids().end());
  const std::vector<BlockHash> chain =
      ComputeBlockHashes(seed, tokens, static_cast<uint32_t>(config_.block_size));
  PD_ASSIGN_OR_RETURN(*placement, policy_->Choose(chain, n, workers_->Snapshot()));

  static std::atomic<uint64_t> epoch{std::random_device{}()};
  decode->set_request_id(
      absl::StrFormat("%08x-%d", epoch.load() & 0xffffffff, next_request_.fetch_add(1)));
  std::string hashes;
  hashes.reserve(chain.size() * 16);
  for (const BlockHash& h : chain) hashes += h.ToBytes();
  decode->set_block_hashes(std::move(hashes));
  *decode->mutable_sampling() = request.sampling();
  if (!request.sampling().has_seed()) {
    thread_local std::mt19937_64 gen{std::random_device{}()};
    decode->mutable_sampling()->set_seed(gen());
  }
  if (placement->prefill_index >= 0) {
    decode->set_prefill_address(workers_->Snapshot()[placement->prefill_index].address);
  }
  decode->set_timeout_ms(request.timeout_ms());
  decode->set_tenant(tenant);
  decode->set_cache_salt(salt);
  return absl::OkStatus();
}

grpc::ServerWriteReactor<v1::GenerateResponse>* GenerationService::Generate(
    grpc::CallbackServerContext* context, const v1::GenerateRequest* request) {
  const absl::Time start = absl::Now();
  iv1::DecodeRequest decode;
  Placement placement;
  absl::StatusOr<std::string> tenant = Authenticate(*context, request);
  absl::Status status = tenant.status();
  if (status.ok()) {
    status = Prepare(*request, *tenant, &decode, &placement);
  }
  if (status.ok()) {
    status = AcquireStream(*tenant);  // released by ReleaseStream, before the client sees the end
  }
  metrics_.routing_latency->WithLabels({}).Observe(absl::ToDoubleSeconds(absl::Now() - start));
  if (!status.ok()) {
    VLOG(1) << "Generate client_request_id=" << request->client_request_id() << ": " << status;
    Count("Generate", status.code());
    return new FinishedWriter(services::ToGrpcStatus(status));
  }
  metrics_.routing->WithLabels({std::string(policy_->name()), placement.reason}).Increment();
  metrics_.prefill_placement->WithLabels({placement.prefill_reason}).Increment();
  metrics_.routed_cached_blocks->WithLabels({}).Increment(
      static_cast<uint64_t>(placement.cached_blocks));
  absl::Time deadline = absl::FromChrono(context->deadline());
  if (request->timeout_ms() > 0) {
    deadline = std::min(deadline, start + absl::Milliseconds(request->timeout_ms()));
  }
  VLOG(1) << "request_id=" << decode.request_id()
          << " client_request_id=" << request->client_request_id() << " -> decode "
          << placement.decode_index << " prefill " << placement.prefill_index << " ("
          << placement.reason << ", " << placement.prefill_reason << ", "
          << placement.cached_blocks << " blocks cached)";
  return new RouterStream(this, context, std::move(decode), std::move(placement), deadline);
}

grpc::ServerUnaryReactor* GenerationService::ListModels(grpc::CallbackServerContext* context,
                                                        const v1::ListModelsRequest* /*request*/,
                                                        v1::ListModelsResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (absl::StatusOr<std::string> tenant = Authenticate(*context, nullptr); !tenant.ok()) {
    Count("ListModels", tenant.status().code());
    reactor->Finish(services::ToGrpcStatus(tenant.status()));
    return reactor;
  }
  bool any = false;
  for (const WorkerSnapshot& w : workers_->Snapshot()) {
    any = any || (w.healthy && w.can_decode);
  }
  if (any) {  // a model is served only while a decode worker is up
    v1::ModelInfo* m = response->add_models();
    m->set_id(model_id_);
    m->set_block_size(static_cast<uint32_t>(config_.block_size));
    m->set_max_context_tokens(static_cast<uint32_t>(model_->config().seq_len));
    m->set_fingerprint(model_->fingerprint());
    m->set_vocab_size(static_cast<uint32_t>(model_->config().vocab_size));
  }
  Count("ListModels", absl::StatusCode::kOk);
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

}  // namespace pd::router
