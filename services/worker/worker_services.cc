#include "services/worker/worker_services.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <deque>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/log/log.h"
#include "services/base/grpc_status.h"
#include "services/worker/convert.h"

namespace pd::worker {
namespace {

namespace iv1 = pdserve::internal::v1;

const std::vector<double>& LatencyBuckets() {
  static const std::vector<double> b = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                                        0.5,   1,      2.5,   5,    10,    30,   60};
  return b;
}

void Count(const WorkerContext* ctx, absl::string_view rpc, absl::StatusCode code) {
  ctx->metrics.requests->WithLabels({std::string(rpc), absl::StatusCodeToString(code)}).Increment();
}

absl::Time DeadlineOf(const grpc::CallbackServerContext* context, uint32_t timeout_ms) {
  absl::Time deadline = absl::FromChrono(context->deadline());
  if (timeout_ms > 0) {
    deadline = std::min(deadline, absl::Now() + absl::Milliseconds(timeout_ms));
  }
  return deadline;
}

// What the remote-prefill path learns that the final response reports. Shared by the stream
// and the prefill call, which may outlive each other.
struct RemoteStats {
  std::atomic<uint64_t> kv_transfer_us{0};
  std::atomic<uint32_t> prefill_cached_tokens{0};
  std::atomic<uint32_t> prefill_tier_cached_tokens{0};
  std::atomic<uint64_t> kv_restore_us{0};
};

// Submits `r` to the engine; with the node's tiers configured, first asks them for the blocks
// of `chain_bytes` (the prompt's hash chain) after the pool's cached prefix, and attaches what
// they pinned as r.tier_prefix. `rejected` runs (on a gRPC or the tier client's thread) when the
// engine refuses the request; exactly one of the request's final output or `rejected` happens.
void SubmitWithTiers(WorkerContext* ctx, const std::string& chain_bytes,
                     engine::GenerationRequest r,
                     std::function<void(const absl::Status&)> rejected) {
  std::vector<BlockHash> chain;
  if (ctx->tiers != nullptr) {
    // A malformed chain only costs the tier lookup; the scheduler hashes the prompt itself.
    chain = SplitBlockHashes(chain_bytes).value_or(std::vector<BlockHash>{});
  }
  const int64_t local = chain.empty() ? 0 : ctx->local_blocks->LeadingMatch(chain);
  if (ctx->tiers == nullptr || local >= static_cast<int64_t>(chain.size())) {
    if (absl::Status s = ctx->loop->Submit(std::move(r)); !s.ok()) {
      rejected(s);
    }
    return;
  }
  std::vector<BlockHash> tail(chain.begin() + local, chain.end());
  auto request = std::make_shared<engine::GenerationRequest>(std::move(r));
  ctx->tiers->Prepare(tail, [ctx, request, local, tail, rejected = std::move(rejected)](
                                std::shared_ptr<const tierd::PromotedRun> run) {
    if (run != nullptr) {
      engine::TierPrefix& tp = request->tier_prefix;
      tp.first_block = local;
      tp.chain.assign(tail.begin(), tail.begin() + static_cast<int64_t>(run->size()));
      if (memory::HostKvPool* pool = ctx->runtime->kv_pool()) {
        tp.copy_in = [run, pool, local](int64_t index, BlockId dst) {
          const int64_t k = index - local;
          return k >= 0 && k < static_cast<int64_t>(run->size()) &&
                 run->CopyOut(static_cast<size_t>(k), pool->BlockData(dst));
        };
      } else {
        // Device pool: cudaMemcpyAsync straight from tierd's shared memory (page-locked by the
        // worker's TierClient on_map hook) into the device block, then the shm bytes are
        // verified against tierd's checksum; a failed copy or checksum stops the restore there.
        memory::KvPoolMemory* device_pool = ctx->runtime->kv_memory();
        tp.copy_in = [run, device_pool, local](int64_t index, BlockId dst) {
          const int64_t k = index - local;
          if (k < 0 || k >= static_cast<int64_t>(run->size()) ||
              run->block_bytes() != static_cast<int64_t>(device_pool->block_bytes())) {
            return false;
          }
          absl::Status s = device_pool->WriteBlock(dst, run->BlockBytes(static_cast<size_t>(k)));
          if (!s.ok()) {
            LOG_EVERY_N(WARNING, 100)
                << "tier restore into device block " << dst.value() << " failed: " << s;
            return false;
          }
          return run->Verify(static_cast<size_t>(k));
        };
      }
      tp.release = [tiers = ctx->tiers, run] { tiers->Release(*run); };
    }
    if (absl::Status s = ctx->loop->Submit(std::move(*request)); !s.ok()) {
      if (run != nullptr) {
        ctx->tiers->Release(*run);  // the refused request never reached the scheduler
      }
      rejected(s);
    }
  });
}

// DecodeService.Generate: engine outputs -> stream messages, one write in flight, queued
// outputs coalesced. Finishes after the engine's final output (every submitted request gets
// one: completion, cancellation, deadline or engine shutdown), so engine callbacks never see
// a deleted reactor.
class GenerateReactor final : public grpc::ServerWriteReactor<iv1::DecodeResponse> {
 public:
  GenerateReactor(WorkerContext* ctx, pd::RequestId id, std::string request_id,
                  std::shared_ptr<RemoteStats> remote)
      : ctx_(ctx), id_(id), request_id_(std::move(request_id)), remote_(std::move(remote)) {}

  // Ends the call before anything was submitted to the engine.
  void Reject(const absl::Status& status) {
    Count(ctx_, "Decode.Generate", status.code());
    Finish(services::ToGrpcStatus(status));
  }

  // Engine loop thread.
  void OnEngineOutput(engine::GenerationOutput out) {
    iv1::DecodeResponse msg;
    msg.mutable_token_ids()->Add(out.new_tokens.begin(), out.new_tokens.end());
    msg.set_text(ToValidUtf8(std::move(out.text)));
    const bool last = out.finish_reason != engine::FinishReason::kNone;
    if (last) {
      msg.set_finish_reason(FinishReasonToProto(out.finish_reason));
      const uint32_t p_cached = remote_->prefill_cached_tokens.load();
      msg.mutable_usage()->set_prompt_tokens(out.prompt_tokens);
      const uint32_t cached = std::min(out.prompt_tokens, out.cached_tokens + p_cached);
      msg.mutable_usage()->set_cached_tokens(cached);
      msg.mutable_usage()->set_completion_tokens(out.completion_tokens);
      // Of those, restored from the node's tiers here or on the prefill worker.
      msg.mutable_usage()->set_tier_cached_tokens(
          std::min(cached, out.restored_tokens + remote_->prefill_tier_cached_tokens.load()));
      pdserve::v1::Timings* t = msg.mutable_timings();
      t->set_queue_us(absl::ToInt64Microseconds(out.timings.queue));
      t->set_prefill_us(absl::ToInt64Microseconds(out.timings.prefill));
      t->set_first_token_us(absl::ToInt64Microseconds(out.timings.first_token));
      t->set_total_us(absl::ToInt64Microseconds(out.timings.total));
      t->set_kv_transfer_us(remote_->kv_transfer_us.load());
      t->set_kv_restore_us(absl::ToInt64Microseconds(out.timings.restore) +
                           remote_->kv_restore_us.load());
      msg.set_prefilled_locally(!out.prefilled_remotely);
      RecordFinal(out);
    }
    std::optional<grpc::Status> finish;
    {
      absl::MutexLock lock(&mu_);
      if (!broken_) {
        // Once the client is gone nothing more is written; queueing would keep the final
        // status from ever being returned (MaybeWriteLocked finishes on an empty queue).
        queue_.push_back(std::move(msg));
      }
      if (last) {
        final_queued_ = true;
        final_status_ = out.status;
      }
      finish = MaybeWriteLocked();
    }
    // Outside the lock: OnDone (which deletes this) may run as soon as Finish is called.
    if (finish.has_value()) Finish(*finish);
  }

  void OnWriteDone(bool ok) override {
    std::optional<grpc::Status> finish;
    {
      absl::MutexLock lock(&mu_);
      writing_ = false;
      if (!ok) {
        broken_ = true;  // client gone: make the engine stop, then finish
        queue_.clear();
        ctx_->loop->Post([id = id_](engine::Scheduler& s) { (void)s.Cancel(id); });
      }
      finish = MaybeWriteLocked();
    }
    if (finish.has_value()) Finish(*finish);
  }

  void OnCancel() override {
    ctx_->loop->Post([id = id_](engine::Scheduler& s) { (void)s.Cancel(id); });
  }

  void OnDone() override { delete this; }

 private:
  // Starts the next write, or returns the status to Finish with once the final output was
  // written (exactly once).
  std::optional<grpc::Status> MaybeWriteLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (writing_ || finished_) {
      return std::nullopt;
    }
    if (!queue_.empty() && !broken_) {
      current_ = std::move(queue_.front());
      queue_.pop_front();
      while (!queue_.empty()) {  // coalesce what piled up while a write was in flight
        iv1::DecodeResponse& next = queue_.front();
        current_.mutable_token_ids()->MergeFrom(next.token_ids());
        current_.mutable_text()->append(next.text());
        if (next.finish_reason() != pdserve::v1::FINISH_REASON_UNSPECIFIED) {
          current_.set_finish_reason(next.finish_reason());
          *current_.mutable_usage() = next.usage();
          *current_.mutable_timings() = next.timings();
          current_.set_prefilled_locally(next.prefilled_locally());
        }
        queue_.pop_front();
      }
      writing_ = true;
      StartWrite(&current_);
      return std::nullopt;
    }
    if (final_queued_ && queue_.empty()) {
      finished_ = true;
      Count(ctx_, "Decode.Generate", final_status_.code());
      return services::ToGrpcStatus(final_status_);
    }
    return std::nullopt;
  }

  void RecordFinal(const engine::GenerationOutput& out) {
    const WorkerMetrics& m = ctx_->metrics;
    if (out.completion_tokens > 0) {
      m.ttft->WithLabels({}).Observe(absl::ToDoubleSeconds(out.timings.first_token));
    }
    if (out.completion_tokens > 1) {
      m.tpot->WithLabels({}).Observe(
          absl::ToDoubleSeconds(out.timings.total - out.timings.first_token) /
          (out.completion_tokens - 1));
    }
    m.queue->WithLabels({}).Observe(absl::ToDoubleSeconds(out.timings.queue));
    m.e2e->WithLabels({}).Observe(absl::ToDoubleSeconds(out.timings.total));
    m.tokens->WithLabels({"prompt"}).Increment(out.prompt_tokens);
    m.tokens->WithLabels({"cached"}).Increment(out.cached_tokens);
    m.tokens->WithLabels({"generated"}).Increment(out.completion_tokens);
    VLOG(1) << "request_id=" << request_id_ << " finished: " << out.completion_tokens
            << " tokens, status " << out.status;
  }

  WorkerContext* const ctx_;
  const pd::RequestId id_;
  const std::string request_id_;
  const std::shared_ptr<RemoteStats> remote_;
  absl::Mutex mu_;
  std::deque<iv1::DecodeResponse> queue_ ABSL_GUARDED_BY(mu_);
  iv1::DecodeResponse current_;  // the message being written
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool broken_ ABSL_GUARDED_BY(mu_) = false;
  bool final_queued_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status final_status_ ABSL_GUARDED_BY(mu_);
};

// One outstanding PrefillService.Prefill call of the decode side.
struct PrefillCall {
  grpc::ClientContext client;
  iv1::PrefillRequest request;
  iv1::PrefillResponse response;
};

// Runs on the engine loop thread (GenerationRequest::remote_prefill): announces the target
// blocks to the transport, then asks the prefill worker to fill them. Always ends in exactly
// one CompleteRemotePrefill or FailRemotePrefill for the request.
void StartRemotePrefill(WorkerContext* ctx, iv1::PrefillService::Stub* stub,
                        std::shared_ptr<const iv1::DecodeRequest> decode,
                        engine::RemotePrefillTarget target, absl::Time deadline,
                        std::shared_ptr<RemoteStats> remote) {
  const pd::RequestId id = target.id;
  auto fail = [ctx, id, request_id = decode->request_id()](const absl::Status& why) {
    LOG(WARNING) << "request_id=" << request_id
                 << ": remote prefill failed, prefilling locally: " << why;
    ctx->metrics.prefills->WithLabels({"fallback"}).Increment();
    ctx->loop->Post([id](engine::Scheduler& s) { (void)s.FailRemotePrefill(id); });
  };
  const uint64_t tag = ctx->handoff->NextTag();
  absl::StatusOr<transport::Expectation> exp = ctx->handoff->Expect(
      tag, target.block_ids, std::max(deadline - absl::Now(), absl::Milliseconds(1)));
  if (!exp.ok()) {
    fail(exp.status());
    return;
  }
  auto* call = new PrefillCall();
  iv1::PrefillRequest& req = call->request;
  req.set_request_id(decode->request_id());
  *req.mutable_layout() = ctx->layout;
  *req.mutable_token_ids() = decode->token_ids();
  *req.mutable_sampling() = decode->sampling();
  req.set_block_hashes(HashesToBytes(target.chain));
  req.set_num_cached_blocks(static_cast<uint32_t>(target.first_block));
  for (BlockId b : target.block_ids) {
    req.add_target_block_ids(b.value());
  }
  req.set_transport(std::string(ctx->handoff->backend()));
  req.set_transport_endpoint(ctx->handoff->endpoint());
  req.set_transport_descriptor(exp->descriptor);
  req.set_transfer_tag(tag);
  req.set_decode_worker_id(ctx->worker_id);
  req.set_cache_salt(decode->cache_salt());
  call->client.set_deadline(absl::ToChronoTime(deadline));
  const TransferId expectation = exp->id;
  stub->async()->Prefill(
      &call->client, &call->request, &call->response,
      [ctx, call, expectation, deadline, fail, id, remote](grpc::Status status) {
        std::unique_ptr<PrefillCall> owned(call);
        if (!status.ok()) {
          (void)ctx->handoff->Cancel(expectation);
          fail(services::FromGrpcStatus(status));
          return;
        }
        const uint32_t first = call->response.first_token_id();
        remote->kv_transfer_us = call->response.timings().kv_transfer_us();
        remote->prefill_cached_tokens = call->response.prefill_cached_tokens();
        remote->prefill_tier_cached_tokens = call->response.prefill_tier_cached_tokens();
        remote->kv_restore_us = call->response.timings().kv_restore_us();
        ctx->handoff->WhenDone(
            expectation, deadline,
            [ctx, expectation, fail, id, first](const transport::TransferState& st) {
              if (st.phase != transport::TransferPhase::kDone) {
                (void)ctx->handoff->Cancel(expectation);
                fail(st.status);
                return;
              }
              ctx->metrics.prefills->WithLabels({"remote"}).Increment();
              ctx->metrics.kv_transfer_bytes->WithLabels({"in"}).Increment(st.bytes);
              ctx->loop->Post([id, first](engine::Scheduler& s) {
                absl::Status done = s.CompleteRemotePrefill(id, first);
                if (!done.ok()) {
                  LOG(WARNING) << done;
                }
              });
            });
      });
}

}  // namespace

absl::StatusOr<WorkerMetrics> WorkerMetrics::Register(metrics::Registry* r) {
  WorkerMetrics m;
  PD_ASSIGN_OR_RETURN(
      m.requests, r->AddCounter("pd_worker_requests_total",
                                "Internal RPCs by method and final gRPC code", {"rpc", "code"}));
  PD_ASSIGN_OR_RETURN(m.ttft, r->AddHistogram("pd_worker_ttft_seconds",
                                              "Decode worker: request received to first token", {},
                                              LatencyBuckets()));
  PD_ASSIGN_OR_RETURN(m.tpot, r->AddHistogram("pd_worker_tpot_seconds",
                                              "Decode worker: mean time per output token after "
                                              "the first, per request",
                                              {}, LatencyBuckets()));
  PD_ASSIGN_OR_RETURN(
      m.queue, r->AddHistogram("pd_worker_queue_seconds", "Request received to first scheduled", {},
                               LatencyBuckets()));
  PD_ASSIGN_OR_RETURN(
      m.e2e, r->AddHistogram("pd_worker_e2e_seconds", "Decode worker: request received to finished",
                             {}, LatencyBuckets()));
  PD_ASSIGN_OR_RETURN(m.prefills, r->AddCounter("pd_worker_prefills_total",
                                                "Prefills of decode requests by where they ran "
                                                "(local, remote, fallback = remote failed)",
                                                {"where"}));
  PD_ASSIGN_OR_RETURN(m.kv_transfer_bytes,
                      r->AddCounter("pd_worker_kv_transfer_bytes_total",
                                    "KV bytes moved by the prefill/decode handoff (in = received "
                                    "by decode, out = sent by prefill)",
                                    {"direction"}));
  PD_ASSIGN_OR_RETURN(m.kv_transfer_seconds,
                      r->AddHistogram("pd_worker_kv_transfer_seconds",
                                      "Prefill side: posting a KV transfer to its completion",
                                      {"direction"}, LatencyBuckets()));
  PD_ASSIGN_OR_RETURN(m.tokens, r->AddCounter("pd_worker_tokens_total",
                                              "Tokens of finished decode requests by kind "
                                              "(prompt, cached, generated)",
                                              {"kind"}));
  return m;
}

pdserve::internal::v1::WorkerInfo WorkerContext::Info() const {
  iv1::WorkerInfo info;
  info.set_worker_id(worker_id);
  switch (config.role) {
    case WorkerRole::kPrefill:
      info.set_role(iv1::WORKER_ROLE_PREFILL);
      break;
    case WorkerRole::kDecode:
      info.set_role(iv1::WORKER_ROLE_DECODE);
      break;
    case WorkerRole::kBoth:
      info.set_role(iv1::WORKER_ROLE_BOTH);
      break;
  }
  info.set_grpc_address(grpc_address);
  info.set_node_name(node_name);
  info.set_model_fingerprint(runtime->fingerprint());
  *info.mutable_layout() = layout;
  if (handoff != nullptr) {
    info.add_transports(std::string(handoff->backend()));
  }
  return info;
}

pdserve::internal::v1::WorkerLoad WorkerContext::Load() const {
  const engine::SchedulerStats s = loop->Stats();
  iv1::WorkerLoad load;
  load.set_worker_id(worker_id);
  load.set_queued_prefill_tokens(static_cast<uint64_t>(s.pending_prefill_tokens));
  load.set_active_kv_blocks(static_cast<uint64_t>(s.kv.num_blocks_used));
  load.set_free_kv_blocks(static_cast<uint64_t>(s.kv.num_blocks_free + s.kv.num_blocks_cached));
  load.set_total_kv_blocks(static_cast<uint64_t>(s.kv.num_blocks_total));
  load.set_num_running_requests(static_cast<uint32_t>(s.running));
  load.set_num_waiting_requests(static_cast<uint32_t>(s.waiting));
  return load;
}

pd::RequestId WorkerContext::NewRequestId() { return pd::RequestId(next_request_id_++); }

iv1::PrefillService::Stub* PrefillClients::Get(const std::string& address) {
  absl::MutexLock lock(&mu_);
  auto& stub = stubs_[address];
  if (stub == nullptr) {
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(64 << 20);
    args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
    args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
    args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
    stub = iv1::PrefillService::NewStub(security_->CreateChannel(address, args));
  }
  return stub.get();
}

grpc::ServerWriteReactor<iv1::DecodeResponse>* DecodeServiceImpl::Generate(
    grpc::CallbackServerContext* context, const iv1::DecodeRequest* request) {
  auto remote = std::make_shared<RemoteStats>();
  const pd::RequestId id = ctx_->NewRequestId();
  auto* reactor = new GenerateReactor(ctx_, id, request->request_id(), remote);
  if (absl::Status auth = ctx_->cluster_auth.Check(*context, "DecodeService.Generate");
      !auth.ok()) {
    reactor->Reject(auth);
    return reactor;
  }
  if (ctx_->config.role == WorkerRole::kPrefill) {
    reactor->Reject(absl::FailedPreconditionError(
        absl::StrCat("worker ", ctx_->worker_id, " runs as prefill; it does not decode")));
    return reactor;
  }
  if (request->request_id().empty()) {
    reactor->Reject(absl::InvalidArgumentError("request_id is empty"));
    return reactor;
  }
  absl::StatusOr<engine::SamplingOptions> sampling = SamplingFromProto(request->sampling());
  if (!sampling.ok()) {
    reactor->Reject(sampling.status());
    return reactor;
  }
  const absl::Time deadline = DeadlineOf(context, request->timeout_ms());
  engine::GenerationRequest r;
  r.id = id;
  r.prompt.assign(request->token_ids().begin(), request->token_ids().end());
  r.sampling = *std::move(sampling);
  r.cache_salt = request->cache_salt();
  if (deadline != absl::InfiniteFuture()) {
    r.deadline = deadline;
  }
  r.on_output = [reactor](engine::GenerationOutput out) {
    reactor->OnEngineOutput(std::move(out));
  };
  if (!request->prefill_address().empty() && ctx_->handoff != nullptr) {
    auto decode = std::make_shared<const iv1::DecodeRequest>(*request);
    iv1::PrefillService::Stub* stub = prefill_clients_.Get(request->prefill_address());
    const absl::Time prefill_deadline =
        std::min(deadline, absl::Now() + ctx_->config.prefill_timeout);
    WorkerContext* ctx = ctx_;
    r.remote_prefill = [ctx, stub, decode, prefill_deadline,
                        remote](engine::RemotePrefillTarget target) {
      StartRemotePrefill(ctx, stub, decode, std::move(target), prefill_deadline, remote);
    };
  } else {
    ctx_->metrics.prefills->WithLabels({"local"}).Increment();
  }
  SubmitWithTiers(ctx_, request->block_hashes(), std::move(r),
                  [reactor](const absl::Status& s) { reactor->Reject(s); });
  return reactor;
}

grpc::ServerUnaryReactor* DecodeServiceImpl::GetLoad(grpc::CallbackServerContext* context,
                                                     const iv1::GetLoadRequest* /*request*/,
                                                     iv1::WorkerLoad* response) {
  auto* reactor = context->DefaultReactor();
  const absl::Status auth = ctx_->cluster_auth.Check(*context, "DecodeService.GetLoad");
  if (auth.ok()) *response = ctx_->Load();
  reactor->Finish(services::ToGrpcStatus(auth));
  return reactor;
}

grpc::ServerUnaryReactor* DecodeServiceImpl::GetInfo(grpc::CallbackServerContext* context,
                                                     const iv1::GetInfoRequest* /*request*/,
                                                     iv1::WorkerInfo* response) {
  auto* reactor = context->DefaultReactor();
  const absl::Status auth = ctx_->cluster_auth.Check(*context, "DecodeService.GetInfo");
  if (auth.ok()) *response = ctx_->Info();
  reactor->Finish(services::ToGrpcStatus(auth));
  return reactor;
}

namespace {

// The state of one PrefillService.Prefill call, shared by the engine callbacks and the
// transfer completion; Finish runs once.
struct PrefillJob {
  WorkerContext* ctx;
  grpc::ServerUnaryReactor* reactor;
  iv1::PrefillResponse* response;
  pd::RequestId id;
  iv1::PrefillRequest request;  // a copy: the call's request may not outlive Finish
  absl::Time received;
  absl::Time deadline;
  std::atomic<bool> finished{false};

  void Finish(const absl::Status& status) {
    if (finished.exchange(true)) {
      return;
    }
    Count(ctx, "Prefill.Prefill", status.code());
    reactor->Finish(services::ToGrpcStatus(status));
  }
};

absl::Status ValidatePrefill(const WorkerContext& ctx, const iv1::PrefillRequest& req) {
  PD_RETURN_IF_ERROR(CheckLayout(ctx.layout, req.layout(), "prefill", "decode"));
  if (ctx.handoff == nullptr || req.transport() != ctx.handoff->backend()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "decode worker uses transport '", req.transport(), "', this prefill worker runs '",
        ctx.handoff == nullptr ? "none" : std::string(ctx.handoff->backend()), "'"));
  }
  const int64_t n = req.token_ids_size();
  if (n == 0) {
    return absl::InvalidArgumentError("token_ids is empty");
  }
  const int64_t bs = ctx.layout.block_size();
  const int64_t full = n / bs;
  const int64_t blocks = (n + bs - 1) / bs;
  if (req.num_cached_blocks() > full || req.num_cached_blocks() == blocks) {
    return absl::InvalidArgumentError(absl::StrCat("num_cached_blocks ", req.num_cached_blocks(),
                                                   " out of range for a prompt of ", n, " tokens (",
                                                   blocks, " blocks)"));
  }
  if (req.target_block_ids_size() != blocks - req.num_cached_blocks()) {
    return absl::InvalidArgumentError(
        absl::StrCat("target_block_ids has ", req.target_block_ids_size(), " entries, expected ",
                     blocks - req.num_cached_blocks(), " (", blocks, " prompt blocks, ",
                     req.num_cached_blocks(), " cached)"));
  }
  if (req.transport_endpoint().empty() || req.transport_descriptor().empty()) {
    return absl::InvalidArgumentError("transport_endpoint and transport_descriptor are required");
  }
  return absl::OkStatus();
}

}  // namespace

grpc::ServerUnaryReactor* PrefillServiceImpl::Prefill(grpc::CallbackServerContext* context,
                                                      const iv1::PrefillRequest* request,
                                                      iv1::PrefillResponse* response) {
  auto job = std::make_shared<PrefillJob>();
  job->ctx = ctx_;
  job->reactor = context->DefaultReactor();
  job->response = response;
  job->id = ctx_->NewRequestId();
  job->received = absl::Now();
  job->deadline = DeadlineOf(context, 0);
  if (absl::Status auth = ctx_->cluster_auth.Check(*context, "PrefillService.Prefill");
      !auth.ok()) {
    job->Finish(auth);
    return job->reactor;
  }
  if (ctx_->config.role == WorkerRole::kDecode) {
    job->Finish(absl::FailedPreconditionError(
        absl::StrCat("worker ", ctx_->worker_id, " runs as decode; it does not serve prefills")));
    return job->reactor;
  }
  absl::Status valid = ValidatePrefill(*ctx_, *request);
  absl::StatusOr<engine::SamplingOptions> sampling = SamplingFromProto(request->sampling());
  if (valid.ok() && !sampling.ok()) {
    valid = sampling.status();
  }
  if (valid.ok()) {
    valid = ctx_->handoff->EnsureConnected(request->transport_endpoint());
  }
  if (!valid.ok()) {
    job->Finish(valid);
    return job->reactor;
  }
  job->request = *request;
  engine::GenerationRequest r;
  r.id = job->id;
  r.prompt.assign(request->token_ids().begin(), request->token_ids().end());
  r.sampling = *std::move(sampling);
  r.cache_salt = request->cache_salt();
  if (job->deadline != absl::InfiniteFuture()) {
    r.deadline = job->deadline;
  }
  r.on_output = [job](engine::GenerationOutput out) {
    if (out.finish_reason != engine::FinishReason::kNone) {
      job->Finish(out.status.ok() ? absl::InternalError("prefill ended without a first token")
                                  : out.status);
    }
  };
  r.on_prefilled = [job](engine::PrefilledBlocks b) {
    WorkerContext* ctx = job->ctx;
    const iv1::PrefillRequest& req = job->request;
    const int64_t first = req.num_cached_blocks();
    std::vector<transport::BlockPair> pairs;
    pairs.reserve(req.target_block_ids_size());
    for (int i = 0; i < req.target_block_ids_size(); ++i) {
      pairs.push_back({b.block_ids[first + i], BlockId(req.target_block_ids(i))});
    }
    auto release = [ctx, id = job->id] {
      ctx->loop->Post([id](engine::Scheduler& s) { (void)s.ReleasePrefilled(id); });
    };
    const absl::Time posted = absl::Now();
    absl::StatusOr<TransferId> tid = ctx->handoff->Send(
        req.transport_endpoint(), req.transfer_tag(), pairs, req.transport_descriptor(),
        std::max(job->deadline - posted, absl::Milliseconds(1)));
    if (!tid.ok()) {
      release();
      job->Finish(tid.status());
      return;
    }
    const int64_t block_size = ctx->layout.block_size();
    const uint32_t p_cached =
        static_cast<uint32_t>(std::max<int64_t>(0, b.cached_tokens - first * block_size));
    job->response->set_first_token_id(b.first_token);
    job->response->set_prefill_cached_tokens(p_cached);
    job->response->set_prefill_tier_cached_tokens(
        std::min(p_cached, static_cast<uint32_t>(b.restored_tokens)));
    job->response->mutable_timings()->set_kv_restore_us(absl::ToInt64Microseconds(b.restore));
    job->response->mutable_timings()->set_queue_us(absl::ToInt64Microseconds(b.queue));
    job->response->mutable_timings()->set_prefill_us(absl::ToInt64Microseconds(b.prefill));
    ctx->handoff->WhenDone(
        *tid, job->deadline,
        [job, release, posted, n = pairs.size()](const transport::TransferState& st) {
          release();
          if (st.phase != transport::TransferPhase::kDone) {
            job->Finish(st.status);
            return;
          }
          const absl::Duration took = absl::Now() - posted;
          job->response->set_num_blocks_written(static_cast<uint32_t>(n));
          job->response->mutable_timings()->set_kv_transfer_us(absl::ToInt64Microseconds(took));
          const WorkerMetrics& m = job->ctx->metrics;
          m.kv_transfer_bytes->WithLabels({"out"}).Increment(st.bytes);
          m.kv_transfer_seconds->WithLabels({"out"}).Observe(absl::ToDoubleSeconds(took));
          job->Finish(absl::OkStatus());
        });
  };
  SubmitWithTiers(ctx_, request->block_hashes(), std::move(r),
                  [job](const absl::Status& s) { job->Finish(s); });
  return job->reactor;
}

grpc::ServerUnaryReactor* PrefillServiceImpl::GetLoad(grpc::CallbackServerContext* context,
                                                      const iv1::GetLoadRequest* /*request*/,
                                                      iv1::WorkerLoad* response) {
  auto* reactor = context->DefaultReactor();
  const absl::Status auth = ctx_->cluster_auth.Check(*context, "PrefillService.GetLoad");
  if (auth.ok()) *response = ctx_->Load();
  reactor->Finish(services::ToGrpcStatus(auth));
  return reactor;
}

grpc::ServerUnaryReactor* PrefillServiceImpl::GetInfo(grpc::CallbackServerContext* context,
                                                      const iv1::GetInfoRequest* /*request*/,
                                                      iv1::WorkerInfo* response) {
  auto* reactor = context->DefaultReactor();
  const absl::Status auth = ctx_->cluster_auth.Check(*context, "PrefillService.GetInfo");
  if (auth.ok()) *response = ctx_->Info();
  reactor->Finish(services::ToGrpcStatus(auth));
  return reactor;
}

}  // namespace pd::worker
