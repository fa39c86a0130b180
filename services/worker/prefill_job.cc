#include "services/worker/prefill_job.h"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "engine/scheduler/compress_policy.h"
#include "services/base/kv_layout_proto.h"
#include "services/worker/convert.h"
#include "services/worker/tier_restore.h"

namespace pd::worker {

namespace iv1 = pdserve::internal::v1;

PrefillJob::PrefillJob(WorkerContext* ctx, iv1::PrefillRequest request, absl::Time deadline,
                       Done done)
    : ctx_(ctx),
      id_(ctx->NewRequestId()),
      request_(std::move(request)),
      deadline_(deadline),
      done_(std::move(done)) {}

absl::Status PrefillJob::Validate(const WorkerContext& ctx, const iv1::PrefillRequest& req) {
  PD_RETURN_IF_ERROR(services::CheckLayout(ctx.layout, req.layout(), "prefill", "decode"));
  if (ctx.handoff == nullptr || req.transport() != ctx.handoff->backend()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "decode worker uses transport '", req.transport(), "', this prefill worker runs '",
        ctx.handoff == nullptr ? "none" : std::string(ctx.handoff->backend()), "'"));
  }
  if (req.token_ids_size() == 0) {
    return absl::InvalidArgumentError("token_ids is empty");
  }
  // A resumed request's tokens follow its prompt: the blocks cover both.
  int64_t n = req.token_ids_size() + req.resume().token_ids_size();
  const int64_t bs = ctx.layout.block_size();
  if (!req.kv_policy().empty()) {
    // SnapKV here: the blocks hold the kept tokens, the budget in whole blocks (the scheduler
    // checks the rest: engine::Scheduler::Submit).
    PD_RETURN_IF_ERROR(engine::CompressPolicy::Validate(req.kv_policy(), req.kv_budget_tokens(),
                                                        req.kv_recent_tokens()));
    if (req.num_cached_blocks() != 0 || req.resume().token_ids_size() != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "kv_policy ", req.kv_policy(), " with num_cached_blocks ", req.num_cached_blocks(),
          " and ", req.resume().token_ids_size(),
          " resumed tokens: a compressed prompt is computed whole and never resumed"));
    }
    const int64_t budget = (int64_t{req.kv_budget_tokens()} + bs - 1) / bs * bs;
    n = std::min(n, budget);
  }
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

void PrefillJob::Run(WorkerContext* ctx, iv1::PrefillRequest request, absl::Time deadline,
                     Done done) {
  absl::Status valid = Validate(*ctx, request);
  absl::StatusOr<engine::SamplingOptions> sampling = SamplingFromProto(request.sampling());
  if (valid.ok() && !sampling.ok()) {
    valid = sampling.status();
  }
  if (valid.ok()) {
    valid = ctx->handoff->EnsureConnected(request.transport_endpoint());
  }
  if (!valid.ok()) {
    done(valid, iv1::PrefillResponse());
    return;
  }
  // Shared by the engine callbacks and the transfer completion; the last one frees it.
  std::shared_ptr<PrefillJob> job(
      new PrefillJob(ctx, std::move(request), deadline, std::move(done)));
  const iv1::PrefillRequest& req = job->request_;
  engine::GenerationRequest r;
  r.id = job->id_;
  r.prompt.assign(req.token_ids().begin(), req.token_ids().end());
  r.sampling = *std::move(sampling);
  r.cache_salt = req.cache_salt();
  r.resume.tokens.assign(req.resume().token_ids().begin(), req.resume().token_ids().end());
  r.resume.text_offset = req.resume().text_offset();
  r.prefill_kv_policy = {req.kv_policy(), req.kv_budget_tokens(), req.kv_recent_tokens()};
  if (deadline != absl::InfiniteFuture()) {
    r.deadline = deadline;
  }
  r.on_output = [job](engine::GenerationOutput out) {
    // Only a failure before on_prefilled produces an output (engine/scheduler/request.h).
    if (out.finish_reason != engine::FinishReason::kNone) {
      job->Finish(out.status.ok() ? absl::InternalError("prefill ended without a first token")
                                  : out.status);
    }
  };
  r.on_prefilled = [job](engine::PrefilledBlocks b) { job->OnPrefilled(job, std::move(b)); };
  SubmitWithTiers(ctx, req.block_hashes(), std::move(r),
                  [job](const absl::Status& s) { job->Finish(s); });
}

void PrefillJob::OnPrefilled(std::shared_ptr<PrefillJob> self, engine::PrefilledBlocks b) {
  const iv1::PrefillRequest& req = request_;
  const int64_t first = req.num_cached_blocks();
  if (static_cast<int64_t>(b.block_ids.size()) != first + req.target_block_ids_size()) {
    // (Validate and the engine agree on the count; a mismatch would write the wrong blocks.)
    ReleaseBlocks();
    Finish(absl::InternalError(absl::StrCat("prefill computed ", b.block_ids.size(),
                                            " blocks, the decode worker expects ",
                                            first + req.target_block_ids_size())));
    return;
  }
  std::vector<transport::BlockPair> pairs;
  pairs.reserve(req.target_block_ids_size());
  for (int i = 0; i < req.target_block_ids_size(); ++i) {
    pairs.push_back({b.block_ids[first + i], BlockId(req.target_block_ids(i))});
  }
  const absl::Time posted = absl::Now();
  absl::StatusOr<TransferId> tid = ctx_->handoff->Send(
      req.transport_endpoint(), req.transfer_tag(), pairs, req.transport_descriptor(),
      std::max(deadline_ - posted, absl::Milliseconds(1)));
  if (!tid.ok()) {
    ReleaseBlocks();
    Finish(tid.status());
    return;
  }
  const int64_t block_size = ctx_->layout.block_size();
  const uint32_t p_cached =
      static_cast<uint32_t>(std::max<int64_t>(0, b.cached_tokens - first * block_size));
  response_.set_first_token_id(b.first_token);
  response_.set_kv_kept_tokens(static_cast<uint32_t>(b.kept_tokens));
  if (b.first_logprob.has_value()) {
    TokenLogprobToProto(*b.first_logprob, response_.mutable_first_logprob());
  }
  response_.set_prefill_cached_tokens(p_cached);
  response_.set_prefill_tier_cached_tokens(
      std::min(p_cached, static_cast<uint32_t>(b.restored_tokens)));
  response_.mutable_timings()->set_kv_restore_us(absl::ToInt64Microseconds(b.restore));
  response_.mutable_timings()->set_queue_us(absl::ToInt64Microseconds(b.queue));
  response_.mutable_timings()->set_prefill_us(absl::ToInt64Microseconds(b.prefill));
  ctx_->handoff->WhenDone(
      *tid, deadline_,
      [self = std::move(self), posted, n = pairs.size()](const transport::TransferState& st) {
        self->ReleaseBlocks();
        if (st.phase != transport::TransferPhase::kDone) {
          self->Finish(st.status);
          return;
        }
        const absl::Duration took = absl::Now() - posted;
        self->response_.set_num_blocks_written(static_cast<uint32_t>(n));
        self->response_.mutable_timings()->set_kv_transfer_us(absl::ToInt64Microseconds(took));
        const WorkerMetrics& m = self->ctx_->metrics;
        m.kv_transfer_bytes->WithLabels({"out"}).Increment(st.bytes);
        m.kv_transfer_seconds->WithLabels({"out"}).Observe(absl::ToDoubleSeconds(took));
        self->Finish(absl::OkStatus());
      });
}

void PrefillJob::ReleaseBlocks() {
  ctx_->loop->Post([id = id_](engine::Scheduler& s) { (void)s.ReleasePrefilled(id); });
}

void PrefillJob::Finish(const absl::Status& status) {
  if (finished_.exchange(true)) {
    return;
  }
  done_(status, status.ok() ? std::move(response_) : iv1::PrefillResponse());
}

}  // namespace pd::worker
