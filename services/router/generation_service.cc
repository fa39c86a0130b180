#include "services/router/generation_service.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <deque>
#include <optional>
#include <random>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/base/status_macros.h"
#include "common/log/log.h"
#include "kernels/type_names.h"
#include "services/base/grpc_status.h"
#include "services/router/router_stream.h"

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

// The gRPC client side of a RouterStream: its messages become the reactor's writes, the
// client's cancellation the stream's Cancel. Deletes itself (and the stream) when gRPC is done
// with the call, which is after End: the worker calls are done then.
class GrpcStreamWriter final : public grpc::ServerWriteReactor<v1::GenerateResponse>,
                               public StreamSink {
 public:
  GrpcStreamWriter() = default;
  // Starts `stream`, whose sink is this writer.
  void Start(std::unique_ptr<RouterStream> stream) {
    stream_ = std::move(stream);
    stream_->Start();
  }

  void Send(const v1::GenerateResponse& response) override { StartWrite(&response); }
  void End(const absl::Status& status) override { Finish(services::ToGrpcStatus(status)); }

  void OnWriteDone(bool ok) override { stream_->OnSent(ok); }
  void OnCancel() override { stream_->Cancel(); }
  void OnDone() override { delete this; }  // gRPC's reactor ownership contract

 private:
  std::unique_ptr<RouterStream> stream_;
};

// The gRPC client side of a request of n > 1 choices: one RouterStream per choice, each
// feeding a ChoiceSink of this reactor; their messages, tagged with their index, are written
// one at a time, and a choice's stream hears OnSent once its message was written (so a slow
// client holds every choice back, as with one stream). Choice 0 starts first; its first
// message starts the others on its decode worker (GenerationService::NewStream,
// sibling_decode). The first choice to fail (or to be refused a stream) cancels the others; the
// call finishes once every started stream ended and nothing is left to write: OK when all
// ended OK, else with the first failure. Deletes itself (and the streams) in OnDone.
class GrpcChoicesWriter final : public grpc::ServerWriteReactor<v1::GenerateResponse> {
 public:
  GrpcChoicesWriter(GenerationService* service, const v1::GenerateRequest& request,
                    CallerAuth caller, absl::Time deadline)
      : service_(service),
        request_(request),
        caller_(std::move(caller)),
        deadline_(deadline),
        received_(absl::Now()),
        n_(static_cast<int>(request.n())) {
    request_.set_n(0);  // each choice is a request of one
    for (int i = 0; i < n_; ++i) sinks_.push_back(std::make_unique<ChoiceSink>(this, i));
    streams_.resize(static_cast<size_t>(n_));
  }

  // The sink of choice 0, for NewStream.
  StreamSink* first_sink() { return sinks_[0].get(); }
  // Starts choice 0's stream (made by NewStream with first_sink()).
  void Start(std::unique_ptr<RouterStream> first) {
    RouterStream* s = first.get();
    {
      absl::MutexLock lock(&mu_);
      streams_[0] = std::move(first);
      started_ = 1;
    }
    s->Start();
  }

  void OnWriteDone(bool ok) override {
    RouterStream* written = nullptr;
    bool write_next = false;
    std::vector<RouterStream*> dropped;  // queued when the client left
    {
      absl::MutexLock lock(&mu_);
      written = streams_[static_cast<size_t>(writing_index_)].get();
      writing_ = false;
      if (!ok) client_gone_ = true;
      if (client_gone_) {
        for (const v1::GenerateResponse& r : queue_) {
          dropped.push_back(streams_[r.index()].get());
        }
        queue_.clear();
      } else if (!queue_.empty()) {
        current_ = std::move(queue_.front());
        queue_.pop_front();
        writing_index_ = static_cast<int>(current_.index());
        writing_ = true;
        write_next = true;
      }
    }
    if (!ok) CancelAll();
    written->OnSent(ok);
    for (RouterStream* s : dropped) s->OnSent(false);
    if (write_next) StartWrite(&current_);
    MaybeFinish();
  }
  void OnCancel() override {
    {
      absl::MutexLock lock(&mu_);
      client_gone_ = true;
    }
    CancelAll();
  }
  void OnDone() override { delete this; }  // gRPC's reactor ownership contract

 private:
  class ChoiceSink final : public StreamSink {
   public:
    ChoiceSink(GrpcChoicesWriter* w, int index) : w_(w), index_(index) {}
    void Send(const v1::GenerateResponse& response) override { w_->Send(index_, response); }
    void End(const absl::Status& status) override { w_->End(status); }

   private:
    GrpcChoicesWriter* const w_;
    const int index_;
  };

  void Send(int index, const v1::GenerateResponse& response) {
    bool start_siblings = false;
    bool refuse = false;
    bool write_now = false;
    RouterStream* stream = nullptr;
    {
      absl::MutexLock lock(&mu_);
      stream = streams_[static_cast<size_t>(index)].get();
      if (!failure_.ok() || client_gone_) {
        refuse = true;
      } else {
        v1::GenerateResponse copy = response;
        copy.set_index(static_cast<uint32_t>(index));
        if (writing_) {
          queue_.push_back(std::move(copy));
        } else {
          current_ = std::move(copy);
          writing_index_ = index;
          writing_ = true;
          write_now = true;
        }
        if (index == 0 && !siblings_started_) {
          siblings_started_ = true;
          starting_siblings_ = true;
          start_siblings = true;
        }
      }
    }
    if (refuse) {
      stream->OnSent(false);  // the request failed or the client left: this choice ends too
      return;
    }
    // (Before the write: choice 0 cannot end while its message is not sent.)
    if (start_siblings) StartSiblings();
    if (write_now) StartWrite(&current_);
  }

  void End(const absl::Status& status) {
    bool cancel = false;
    {
      absl::MutexLock lock(&mu_);
      ++ended_;
      if (!status.ok() && failure_.ok()) {
        failure_ = status;
        cancel = true;
      }
    }
    if (cancel) CancelAll();
    MaybeFinish();
  }

  // Starts choices 1 .. n-1 on choice 0's decode worker.
  void StartSiblings() {
    std::string sibling_decode;
    RouterStream* first = nullptr;
    {
      absl::MutexLock lock(&mu_);
      first = streams_[0].get();
    }
    const int worker = first->decode_index();
    for (const WorkerSnapshot& w : service_->workers()->Snapshot()) {
      if (w.index == worker) sibling_decode = w.address;
    }
    const bool seeded = request_.sampling().has_seed();
    const uint64_t seed = request_.sampling().seed();
    for (int i = 1; i < n_; ++i) {
      v1::GenerateRequest choice = request_;
      // Seeded: choice i is the n = 1 answer with seed + i. Unseeded: a seed of its own.
      if (seeded) choice.mutable_sampling()->set_seed(seed + static_cast<uint64_t>(i));
      if (request_.timeout_ms() > 0) {
        // timeout_ms counts from when the request came, for every choice: what is left of it.
        const int64_t left = absl::ToInt64Milliseconds(
            received_ + absl::Milliseconds(request_.timeout_ms()) - absl::Now());
        choice.set_timeout_ms(static_cast<uint32_t>(std::max<int64_t>(1, left)));
      }
      absl::StatusOr<std::unique_ptr<RouterStream>> stream = service_->NewStream(
          choice, caller_, deadline_, sinks_[static_cast<size_t>(i)].get(), sibling_decode);
      RouterStream* started = nullptr;
      {
        absl::MutexLock lock(&mu_);
        if (!stream.ok()) {
          if (failure_.ok()) failure_ = stream.status();
        } else if (failure_.ok() && !client_gone_) {
          streams_[static_cast<size_t>(i)] = *std::move(stream);
          started = streams_[static_cast<size_t>(i)].get();
          ++started_;
        }
      }
      if (started == nullptr) {
        // Refused, or the request failed meanwhile: the started choices are cancelled (a
        // stream made but not started may simply go).
        CancelAll();
        break;
      }
      started->Start();
    }
    {
      absl::MutexLock lock(&mu_);
      starting_siblings_ = false;
    }
    MaybeFinish();
  }

  void CancelAll() {
    std::vector<RouterStream*> all;
    {
      absl::MutexLock lock(&mu_);
      for (const auto& s : streams_) {
        if (s != nullptr) all.push_back(s.get());
      }
    }
    for (RouterStream* s : all) s->Cancel();
  }

  // Finishes the call once every started stream ended, nothing is being written or queued,
  // and no sibling is being started.
  void MaybeFinish() {
    grpc::Status status;
    {
      absl::MutexLock lock(&mu_);
      if (finished_ || writing_ || !queue_.empty() || ended_ < started_ || starting_siblings_) {
        return;
      }
      finished_ = true;
      if (!failure_.ok()) {
        status = services::ToGrpcStatus(failure_);
      } else if (client_gone_) {
        status = grpc::Status(grpc::StatusCode::CANCELLED, "the client cancelled the call");
      } else if (started_ < n_) {
        status = grpc::Status(grpc::StatusCode::INTERNAL,
                              absl::StrCat("only ", started_, " of ", n_, " choices started"));
      }
    }
    Finish(status);
  }

  GenerationService* const service_;
  v1::GenerateRequest request_;
  const CallerAuth caller_;
  const absl::Time deadline_;
  const absl::Time received_;
  const int n_;
  std::vector<std::unique_ptr<ChoiceSink>> sinks_;
  absl::Mutex mu_;
  std::vector<std::unique_ptr<RouterStream>> streams_ ABSL_GUARDED_BY(mu_);
  int started_ ABSL_GUARDED_BY(mu_) = 0;
  int ended_ ABSL_GUARDED_BY(mu_) = 0;
  bool siblings_started_ ABSL_GUARDED_BY(mu_) = false;
  bool starting_siblings_ ABSL_GUARDED_BY(mu_) = false;
  bool client_gone_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status failure_ ABSL_GUARDED_BY(mu_);
  // The message being written (read by gRPC until OnWriteDone) and its choice; the others
  // waiting (at most one per choice: a choice sends again only after its OnSent).
  v1::GenerateResponse current_;
  int writing_index_ ABSL_GUARDED_BY(mu_) = 0;
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  std::deque<v1::GenerateResponse> queue_ ABSL_GUARDED_BY(mu_);
};

// The caller of a gRPC call, as NewStream and Authenticate take it.
CallerAuth GrpcCaller(const grpc::CallbackServerContext& context) {
  CallerAuth caller;
  if (std::optional<absl::string_view> h = services::AuthorizationMetadata(context)) {
    caller.authorization = std::string(*h);
  }
  return caller;
}

}  // namespace

std::string DefaultModelId(const std::string& path) {
  std::string p = path;
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  const size_t slash = p.rfind('/');
  std::string base = slash == std::string::npos ? p : p.substr(slash + 1);
  // A weight file's extension is not part of the model's name (stories260K.bin -> stories260K).
  for (absl::string_view ext : {".bin", ".gguf", ".safetensors"}) {
    if (base.size() > ext.size() && absl::EndsWith(base, ext)) {
      base.resize(base.size() - ext.size());
      break;
    }
  }
  return base;
}

absl::StatusOr<std::unique_ptr<GenerationService>> GenerationService::Create(
    const RouterConfig& config, const engine::ModelFront* model, WorkerPool* workers,
    PlacementPolicy* policy, metrics::Registry* r, std::optional<services::ApiKeyStore> api_keys,
    std::unique_ptr<chat::ChatTemplate> chat_template) {
  PD_RETURN_IF_ERROR(config.limits.Validate());
  std::unique_ptr<GenerationService> s(new GenerationService());
  s->config_ = config;
  s->api_keys_ = std::move(api_keys);
  s->model_ = model;
  s->prompts_ = std::make_unique<PromptEncoder>(model, std::move(chat_template));
  s->workers_ = workers;
  s->policy_ = policy;
  s->model_id_ = config.model_id.empty() ? DefaultModelId(config.model) : config.model_id;
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
  PD_ASSIGN_OR_RETURN(
      m.migrations,
      r->AddCounter("pd_router_migrations_total",
                    "Streams whose decode worker failed (reason=failure) or drained "
                    "(reason=drain) after their first token, by result: moved to another "
                    "worker, or ended because the --max_migrations budget was spent "
                    "(budget_spent) or no worker could take them (no_worker)",
                    {"reason", "result"}));
  PD_ASSIGN_OR_RETURN(m.migration_stall,
                      r->AddHistogram("pd_router_migration_stall_seconds",
                                      "Gap between a moved stream's last token before the move "
                                      "and its first token after it",
                                      {}, LatencyBuckets()));
  PD_ASSIGN_OR_RETURN(m.prefill_placement,
                      r->AddCounter("pd_router_prefill_placements_total",
                                    "Where prompts were prefilled: remote_prefill, "
                                    "below_disagg_threshold, no_prefill_worker, sibling",
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
  metrics_.CountRequest(method, code);
}

absl::StatusOr<std::string> GenerationService::Authenticate(
    const CallerAuth& caller, const v1::GenerateRequest* request) const {
  if (!api_keys_.has_value()) {
    return request != nullptr && request->has_tenant() ? request->tenant() : std::string();
  }
  PD_ASSIGN_OR_RETURN(std::string tenant, api_keys_->AuthenticateHeader(caller.authorization));
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
  in.kv_dtype = std::string(kernels::DTypeName(config_.kv_dtype));  // as the workers' seed
  in.block_size = static_cast<uint32_t>(config_.block_size);
  in.cache_salt = cache_salt;
  PD_ASSIGN_OR_RETURN(BlockHash seed, ComputeHashSeed(in));
  seeds_.emplace(cache_salt, seed);
  return seed;
}

absl::StatusOr<std::vector<BlockHash>> GenerationService::BlockHashesOf(
    const std::string& cache_salt, absl::Span<const uint32_t> tokens) {
  PD_ASSIGN_OR_RETURN(BlockHash seed, SeedFor(cache_salt));
  return ComputeBlockHashes(seed, tokens, static_cast<uint32_t>(config_.block_size));
}

absl::Status GenerationService::Prepare(const v1::GenerateRequest& request,
                                        const std::string& tenant, absl::string_view sibling_decode,
                                        iv1::DecodeRequest* decode, Placement* placement) {
  PD_RETURN_IF_ERROR(ValidateGenerateRequest(request, config_.limits));
  if (!request.model().empty() && request.model() != model_id_) {
    return absl::NotFoundError(absl::StrCat("unknown model '", request.model(),
                                            "'; this router serves '", model_id_, "'"));
  }
  const engine::ModelConfig& mc = model_->config();
  PD_ASSIGN_OR_RETURN(const std::vector<uint32_t> tokens, prompts_->Encode(request));
  decode->mutable_token_ids()->Add(tokens.begin(), tokens.end());
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
  for (const auto& [t, bias] : request.sampling().logit_bias()) {
    if (t >= static_cast<uint32_t>(mc.vocab_size)) {
      return absl::InvalidArgumentError(absl::StrCat("sampling.logit_bias[", t,
                                                     "]: token id is out of range: vocabulary "
                                                     "size is ",
                                                     mc.vocab_size));
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
  const std::vector<BlockHash> chain =
      ComputeBlockHashes(seed, tokens, static_cast<uint32_t>(config_.block_size));
  const std::vector<WorkerSnapshot> snapshot = workers_->Snapshot();
  const WorkerSnapshot* sibling = nullptr;
  for (const WorkerSnapshot& w : snapshot) {
    if (!sibling_decode.empty() && w.address == sibling_decode && w.healthy && w.can_decode) {
      sibling = &w;
    }
  }
  if (sibling != nullptr) {
    // The sibling's blocks hold this prompt: every full block but one holding the last token,
    // which the decode worker computes again to sample this choice's first token.
    const int64_t bs = config_.block_size;
    Placement p;
    p.decode_index = sibling->index;
    p.prefill_index = -1;
    p.reason = "sibling";
    p.prefill_reason = "sibling";
    p.cached_blocks = (n - 1) / bs;
    p.new_blocks = (n + bs - 1) / bs - p.cached_blocks;
    *placement = std::move(p);
  } else {
    PD_ASSIGN_OR_RETURN(*placement, policy_->Choose(chain, n, snapshot));
  }

  static std::atomic<uint64_t> epoch{std::random_device{}()};
  decode->set_request_id(
      absl::StrFormat("%08x-%d", epoch.load() & 0xffffffff, next_request_.fetch_add(1)));
  decode->set_block_hashes(ConcatBlockHashes(chain));
  *decode->mutable_sampling() = request.sampling();
  if (!request.sampling().has_seed()) {
    thread_local std::mt19937_64 gen{std::random_device{}()};
    decode->mutable_sampling()->set_seed(gen());
  }
  if (placement->prefill_index >= 0) {
    decode->set_prefill_address(snapshot[placement->prefill_index].address);
  }
  decode->set_timeout_ms(request.timeout_ms());
  decode->set_tenant(tenant);
  decode->set_cache_salt(salt);
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<RouterStream>> GenerationService::NewStream(
    const v1::GenerateRequest& request, const CallerAuth& caller, absl::Time client_deadline,
    StreamSink* sink, absl::string_view sibling_decode) {
  const absl::Time start = absl::Now();
  iv1::DecodeRequest decode;
  Placement placement;
  absl::StatusOr<std::string> tenant = Authenticate(caller, &request);
  absl::Status status = tenant.status();
  if (status.ok()) {
    status = Prepare(request, *tenant, sibling_decode, &decode, &placement);
  }
  if (status.ok()) {
    status = AcquireStream(*tenant);  // released by ReleaseStream, before the client sees the end
  }
  metrics_.routing_latency->WithLabels({}).Observe(absl::ToDoubleSeconds(absl::Now() - start));
  if (!status.ok()) {
    VLOG(1) << "Generate client_request_id=" << request.client_request_id() << ": " << status;
    Count("Generate", status.code());
    return status;
  }
  metrics_.routing->WithLabels({std::string(policy_->name()), placement.reason}).Increment();
  metrics_.prefill_placement->WithLabels({placement.prefill_reason}).Increment();
  metrics_.routed_cached_blocks->WithLabels({}).Increment(
      static_cast<uint64_t>(placement.cached_blocks));
  absl::Time deadline = client_deadline;
  if (request.timeout_ms() > 0) {
    deadline = std::min(deadline, start + absl::Milliseconds(request.timeout_ms()));
  }
  VLOG(1) << "request_id=" << decode.request_id()
          << " client_request_id=" << request.client_request_id() << " -> decode "
          << placement.decode_index << " prefill " << placement.prefill_index << " ("
          << placement.reason << ", " << placement.prefill_reason << ", " << placement.cached_blocks
          << " blocks cached)";
  return std::make_unique<RouterStream>(this, sink, std::move(decode), std::move(placement),
                                        deadline);
}

grpc::ServerWriteReactor<v1::GenerateResponse>* GenerationService::Generate(
    grpc::CallbackServerContext* context, const v1::GenerateRequest* request) {
  if (request->n() > 1) {
    // Choice 0 is validated, authenticated and placed as any request (n checked there too).
    CallerAuth caller = GrpcCaller(*context);
    const absl::Time deadline = absl::FromChrono(context->deadline());
    auto writer = std::make_unique<GrpcChoicesWriter>(this, *request, caller, deadline);
    v1::GenerateRequest first = *request;
    absl::StatusOr<std::unique_ptr<RouterStream>> stream =
        NewStream(first, caller, deadline, writer->first_sink());
    if (!stream.ok()) {
      return new FinishedWriter(services::ToGrpcStatus(stream.status()));
    }
    writer->Start(*std::move(stream));
    return writer.release();  // deletes itself in OnDone
  }
  auto writer = std::make_unique<GrpcStreamWriter>();
  absl::StatusOr<std::unique_ptr<RouterStream>> stream = NewStream(
      *request, GrpcCaller(*context), absl::FromChrono(context->deadline()), writer.get());
  if (!stream.ok()) {
    return new FinishedWriter(services::ToGrpcStatus(stream.status()));
  }
  writer->Start(*std::move(stream));
  return writer.release();  // deletes itself in OnDone
}

bool GenerationService::ServesModel() const {
  for (const WorkerSnapshot& w : workers_->Snapshot()) {
    if (w.healthy && w.can_decode) return true;
  }
  return false;
}

grpc::ServerUnaryReactor* GenerationService::ListModels(grpc::CallbackServerContext* context,
                                                        const v1::ListModelsRequest* /*request*/,
                                                        v1::ListModelsResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (absl::StatusOr<std::string> tenant = Authenticate(GrpcCaller(*context), nullptr);
      !tenant.ok()) {
    Count("ListModels", tenant.status().code());
    reactor->Finish(services::ToGrpcStatus(tenant.status()));
    return reactor;
  }
  if (ServesModel()) {  // a model is served only while a decode worker is up
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
