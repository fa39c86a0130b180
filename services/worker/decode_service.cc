#include "services/worker/decode_service.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/log/log.h"
#include "common/utf8/utf8.h"
#include "services/base/grpc_status.h"
#include "services/worker/convert.h"
#include "services/worker/remote_prefill.h"
#include "services/worker/status_rpcs.h"
#include "services/worker/tier_restore.h"

namespace pd::worker {
namespace {

namespace iv1 = pdserve::internal::v1;

// The call's deadline, tightened by the request's own timeout_ms (0 = none).
absl::Time DeadlineOf(const grpc::CallbackServerContext* context, uint32_t timeout_ms) {
  absl::Time deadline = absl::FromChrono(context->deadline());
  if (timeout_ms > 0) {
    deadline = std::min(deadline, absl::Now() + absl::Milliseconds(timeout_ms));
  }
  return deadline;
}

// DecodeService.Generate: engine outputs -> stream messages, one write in flight, queued
// outputs coalesced. Finishes after the engine's final output (every submitted request gets
// one: completion, cancellation, deadline or engine shutdown), so engine callbacks never see
// a deleted reactor.
class GenerateReactor final : public grpc::ServerWriteReactor<iv1::DecodeResponse> {
 public:
  GenerateReactor(WorkerContext* ctx, pd::RequestId id, std::string request_id,
                  std::shared_ptr<RemotePrefillStats> remote)
      : ctx_(ctx), id_(id), request_id_(std::move(request_id)), remote_(std::move(remote)) {}

  // Ends the call before anything was submitted to the engine.
  void Reject(const absl::Status& status) {
    ctx_->metrics.CountRequest("Decode.Generate", status.code());
    Finish(services::ToGrpcStatus(status));
  }

  // Engine loop thread.
  void OnEngineOutput(engine::GenerationOutput out) {
    iv1::DecodeResponse msg;
    msg.mutable_token_ids()->Add(out.new_tokens.begin(), out.new_tokens.end());
    msg.set_text(utf8::ToValid(std::move(out.text)));
    msg.set_text_offset(out.text_offset);
    msg.mutable_logprobs()->Reserve(static_cast<int>(out.logprobs.size()));
    for (const engine::TokenLogprob& lp : out.logprobs) {
      TokenLogprobToProto(lp, msg.add_logprobs());
    }
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
        current_.mutable_logprobs()->MergeFrom(next.logprobs());
        current_.set_text_offset(next.text_offset());
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
      ctx_->metrics.CountRequest("Decode.Generate", final_status_.code());
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
  const std::shared_ptr<RemotePrefillStats> remote_;
  absl::Mutex mu_;
  std::deque<iv1::DecodeResponse> queue_ ABSL_GUARDED_BY(mu_);
  iv1::DecodeResponse current_;  // the message being written
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool broken_ ABSL_GUARDED_BY(mu_) = false;
  bool final_queued_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status final_status_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

grpc::ServerWriteReactor<iv1::DecodeResponse>* DecodeServiceImpl::Generate(
    grpc::CallbackServerContext* context, const iv1::DecodeRequest* request) {
  auto remote = std::make_shared<RemotePrefillStats>();
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
  r.resume.tokens.assign(request->resume().token_ids().begin(),
                         request->resume().token_ids().end());
  r.resume.text_offset = request->resume().text_offset();
  if (deadline != absl::InfiniteFuture()) {
    r.deadline = deadline;
  }
  r.on_output = [reactor](engine::GenerationOutput out) {
    reactor->OnEngineOutput(std::move(out));
  };
  // A resumed request (migration) is prefilled like any: its prompt followed by its resumed
  // tokens, by the prefill worker (given the resume state) or here.
  // Under --kv_policy h2o a request is prefilled here: its scores go on with decoding
  // (engine/scheduler/compress_policy.h). Under snapkv the prefill worker compresses the prompt
  // and sends the kept tokens only (a resumed stream's prompt is computed here).
  if (!request->prefill_address().empty() && ctx_->handoff != nullptr &&
      ctx_->config.runtime.scheduler.kv_policy != "h2o") {
    RemotePrefill::Attach(ctx_, prefill_peers_.Get(request->prefill_address()),
                          std::make_shared<const iv1::DecodeRequest>(*request),
                          std::min(deadline, absl::Now() + ctx_->config.prefill_timeout), remote,
                          &r);
  } else {
    ctx_->metrics.prefills
        ->WithLabels({request->resume().token_ids_size() > 0 ? "resumed" : "local"})
        .Increment();
  }
  SubmitWithTiers(ctx_, request->block_hashes(), std::move(r),
                  [reactor](const absl::Status& s) { reactor->Reject(s); });
  return reactor;
}

grpc::ServerUnaryReactor* DecodeServiceImpl::GetLoad(grpc::CallbackServerContext* context,
                                                     const iv1::GetLoadRequest* /*request*/,
                                                     iv1::WorkerLoad* response) {
  return ServeGetLoad(*ctx_, context, "DecodeService.GetLoad", response);
}

grpc::ServerUnaryReactor* DecodeServiceImpl::GetInfo(grpc::CallbackServerContext* context,
                                                     const iv1::GetInfoRequest* /*request*/,
                                                     iv1::WorkerInfo* response) {
  return ServeGetInfo(*ctx_, context, "DecodeService.GetInfo", response);
}

}  // namespace pd::worker
