// The public pdserve.v1.Generation service of pd-router (gRPC callback API).
//
// Generate: validate, tokenize, compute the block-hash chain, place the request on a decode
// worker (and a prefill worker unless the uncached part is short), forward it as
// DecodeService.Generate and relay the stream. The client's deadline, timeout_ms and
// cancellation propagate to the worker; a worker failing mid-stream ends the client's stream
// with UNAVAILABLE and takes the worker out of the pool until it answers health checks again.
//
// With API keys (RouterConfig::api_keys_file) every call is authenticated first: no or an
// unknown key is UNAUTHENTICATED, the request's tenant is the key's, and the cache salt sent to
// the workers is derived from that tenant (and the client's salt), so tenants never share
// cached blocks. At most max_streams_per_tenant streams per tenant are open at once.
//
// The relay itself (and the retry of a worker that fails before the first token) is a
// RouterStream (router_stream.h); Generate drives one through a gRPC ServerWriteReactor, and a
// front end speaking another protocol calls NewStream with a StreamSink of its own.
//
// Thread-safety: handlers run on gRPC's callback threads; the class is thread-safe.
#pragma once

#include <atomic>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/hash/block_hash.h"
#include "common/metrics/metrics.h"
#include "engine/runtime/model_front.h"
#include "pd/v1/generation.grpc.pb.h"
#include "services/base/auth.h"
#include "services/router/placement_policy.h"
#include "services/router/prompt_encoder.h"
#include "services/router/request_validation.h"
#include "services/router/router_config.h"
#include "services/router/router_stream.h"
#include "services/router/worker_pool.h"

namespace pd::router {

// What a front end knows of who calls Generate, for authentication.
struct CallerAuth {
  // The value of the call's "authorization" gRPC metadata or HTTP header ("Bearer <key>");
  // nullopt when the call has none.
  std::optional<std::string> authorization;
};

// The model id served when --model_id is empty: the model path's base name without a weight
// file's extension (.bin, .gguf, .safetensors): ".../stories260K.bin" -> "stories260K",
// ".../Llama-3.2-1B/" -> "Llama-3.2-1B".
std::string DefaultModelId(const std::string& path);

class GenerationService final : public pdserve::v1::Generation::CallbackService,
                                public RouterStreamHost {
 public:
  // Everything passed must outlive the service. Registers the router's metrics. `api_keys`:
  // nullopt = no authentication (the client's tenant and cache_salt are used as sent).
  // `chat_template` (owned; may be null) renders chat prompts (prompts().EncodeChat).
  static absl::StatusOr<std::unique_ptr<GenerationService>> Create(
      const RouterConfig& config, const engine::ModelFront* model, WorkerPool* workers,
      PlacementPolicy* policy, metrics::Registry* metrics,
      std::optional<services::ApiKeyStore> api_keys = std::nullopt,
      std::unique_ptr<chat::ChatTemplate> chat_template = nullptr);

  grpc::ServerWriteReactor<pdserve::v1::GenerateResponse>* Generate(
      grpc::CallbackServerContext* context, const pdserve::v1::GenerateRequest* request) override;

  // Generate for any front end: authenticates `caller`, validates, tokenizes and places
  // `request`, takes a stream slot (--max_inflight, --max_streams_per_tenant) and returns the
  // stream that relays the worker's answer to `sink`; the caller calls Start on it once `sink`
  // can reach it. `client_deadline` is the client's own deadline (InfiniteFuture = none);
  // request.timeout_ms shortens it. On failure nothing is sent to `sink` and the status is what
  // the client gets (UNAUTHENTICATED, PERMISSION_DENIED, INVALID_ARGUMENT, NOT_FOUND,
  // UNAVAILABLE without a decode worker, RESOURCE_EXHAUSTED at a limit); it is counted already.
  // `sibling_decode`: the address of the decode worker a sibling of this request runs on (the
  // choices of n > 1, started once the first one's prompt is computed there): while it is
  // healthy the request runs there with no prefill worker, its prompt's blocks shared with the
  // sibling's (placement reason and prefill placement "sibling"); else it is placed as any.
  absl::StatusOr<std::unique_ptr<RouterStream>> NewStream(
      const pdserve::v1::GenerateRequest& request, const CallerAuth& caller,
      absl::Time client_deadline, StreamSink* sink, absl::string_view sibling_decode = {});

  grpc::ServerUnaryReactor* ListModels(grpc::CallbackServerContext* context,
                                       const pdserve::v1::ListModelsRequest* request,
                                       pdserve::v1::ListModelsResponse* response) override;

  int64_t inflight() const { return inflight_.load(); }

  // The caller's tenant: the API key's when keys are configured (UNAUTHENTICATED without a
  // valid key; PERMISSION_DENIED when `request` names another tenant), else the request's
  // tenant ("" = default). `request` may be null (ListModels). Front ends call it first, so a
  // caller without a key learns nothing else about its request.
  absl::StatusOr<std::string> Authenticate(const CallerAuth& caller,
                                           const pdserve::v1::GenerateRequest* request) const;
  // The served model's id (ListModels, GenerateRequest.model).
  const std::string& model_id() const { return model_id_; }
  // Whether the model is served now: a decode worker is healthy.
  bool ServesModel() const;
  // Turns prompts into tokens: text (Prepare, for both APIs) and chat messages (the HTTP
  // front's /v1/chat/completions, with the chat template given to Create).
  const PromptEncoder& prompts() const { return *prompts_; }

  // RouterStreamHost. ReleaseStream pairs with AcquireStream in NewStream.
  WorkerPool* workers() override { return workers_; }
  PlacementPolicy* policy() override { return policy_; }
  const RouterStreamMetrics& stream_metrics() const override { return metrics_; }
  void ReleaseStream(const std::string& tenant) override;
  int max_migrations() const override { return static_cast<int>(config_.max_migrations); }
  absl::StatusOr<std::vector<BlockHash>> BlockHashesOf(const std::string& cache_salt,
                                                       absl::Span<const uint32_t> tokens) override;

 private:
  // The streams' metrics and the placement's.
  struct Metrics : RouterStreamMetrics {
    metrics::Family<metrics::Counter>* routing = nullptr;            // {policy, reason}
    metrics::Family<metrics::Counter>* prefill_placement = nullptr;  // {placement}
    metrics::Family<metrics::Counter>* routed_cached_blocks = nullptr;
    metrics::Family<metrics::Histogram>* routing_latency = nullptr;
  };

  GenerationService() = default;
  void Count(absl::string_view method, absl::StatusCode code);

  // Counts a new stream (and one of `tenant`'s); RESOURCE_EXHAUSTED at --max_inflight or
  // --max_streams_per_tenant, with nothing counted.
  absl::Status AcquireStream(const std::string& tenant);
  // Validation, tokenization, hashing and placement: the DecodeRequest to send and where.
  absl::Status Prepare(const pdserve::v1::GenerateRequest& request, const std::string& tenant,
                       absl::string_view sibling_decode,
                       pdserve::internal::v1::DecodeRequest* decode, Placement* placement);
  absl::StatusOr<BlockHash> SeedFor(const std::string& cache_salt);

  RouterConfig config_;
  const engine::ModelFront* model_ = nullptr;
  std::unique_ptr<PromptEncoder> prompts_;
  WorkerPool* workers_ = nullptr;
  PlacementPolicy* policy_ = nullptr;
  std::string model_id_;
  Metrics metrics_;
  std::atomic<int64_t> inflight_{0};
  std::atomic<uint64_t> next_request_{1};
  std::optional<services::ApiKeyStore> api_keys_;
  absl::Mutex seeds_mu_;
  absl::flat_hash_map<std::string, BlockHash> seeds_ ABSL_GUARDED_BY(seeds_mu_);
  absl::Mutex tenants_mu_;
  absl::flat_hash_map<std::string, int64_t> tenant_streams_ ABSL_GUARDED_BY(tenants_mu_);
};

}  // namespace pd::router
