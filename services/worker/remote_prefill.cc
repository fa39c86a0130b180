#include "services/worker/remote_prefill.h"

#include <algorithm>
#include <string>
#include <utility>

#include "common/hash/block_hash.h"
#include "common/log/log.h"
#include "services/worker/convert.h"

namespace pd::worker {
namespace {

namespace iv1 = pdserve::internal::v1;

std::atomic<int64_t> live_remote_prefills{0};

}  // namespace

void RemotePrefill::Attach(WorkerContext* ctx, PrefillPeer* peer,
                           std::shared_ptr<const iv1::DecodeRequest> decode, absl::Time deadline,
                           std::shared_ptr<RemotePrefillStats> stats,
                           engine::GenerationRequest* request) {
  request->remote_prefill = [ctx, peer, decode = std::move(decode), deadline,
                             stats = std::move(stats)](engine::RemotePrefillTarget target) {
    Start(ctx, peer, decode, std::move(target), deadline, stats);
  };
}

int64_t RemotePrefill::LiveForTest() { return live_remote_prefills.load(); }

RemotePrefill::RemotePrefill(WorkerContext* ctx, std::shared_ptr<const iv1::DecodeRequest> decode,
                             pd::RequestId id, absl::Time deadline,
                             std::shared_ptr<RemotePrefillStats> stats)
    : ctx_(ctx),
      decode_(std::move(decode)),
      id_(id),
      deadline_(deadline),
      stats_(std::move(stats)) {
  ++live_remote_prefills;
}

RemotePrefill::~RemotePrefill() { --live_remote_prefills; }

void RemotePrefill::Start(WorkerContext* ctx, PrefillPeer* peer,
                          std::shared_ptr<const iv1::DecodeRequest> decode,
                          engine::RemotePrefillTarget target, absl::Time deadline,
                          std::shared_ptr<RemotePrefillStats> stats) {
  // Shared by the peer's answer and the transfer completion; the later one frees it.
  std::shared_ptr<RemotePrefill> self(
      new RemotePrefill(ctx, std::move(decode), target.id, deadline, std::move(stats)));
  const uint64_t tag = ctx->handoff->NextTag();
  // The blocks the prefill worker names: these, or a staged pool's staging blocks for them.
  std::vector<BlockId> wire;
  absl::StatusOr<transport::Expectation> exp = ctx->handoff->Expect(
      tag, target.block_ids, std::max(deadline - absl::Now(), absl::Milliseconds(1)), &wire);
  if (!exp.ok()) {
    {
      absl::MutexLock lock(&self->mu_);
      self->state_ = State::kFailed;
    }
    self->Fail(exp.status(), /*cancel_expectation=*/false);
    return;
  }
  iv1::PrefillRequest request = self->BuildRequest(target, wire, *exp, tag);
  {
    absl::MutexLock lock(&self->mu_);
    self->expectation_ = exp->id;
    self->state_ = State::kCalling;
  }
  // Armed before the call, so that the deadline fails the request even if the peer never
  // answers; a transfer that finishes first waits for the answer (kCalling).
  ctx->handoff->WhenDone(exp->id, deadline,
                         [self](const transport::TransferState& st) { self->OnTransfer(st); });
  peer->Prefill(std::move(request), deadline,
                [self](const absl::Status& status, iv1::PrefillResponse response) {
                  self->OnPeerAnswer(status, response);
                });
}

iv1::PrefillRequest RemotePrefill::BuildRequest(const engine::RemotePrefillTarget& target,
                                                absl::Span<const BlockId> wire_blocks,
                                                const transport::Expectation& expectation,
                                                uint64_t tag) const {
  iv1::PrefillRequest req;
  req.set_request_id(decode_->request_id());
  *req.mutable_layout() = ctx_->layout;
  *req.mutable_token_ids() = decode_->token_ids();
  *req.mutable_sampling() = decode_->sampling();
  req.set_block_hashes(ConcatBlockHashes(target.chain));
  req.set_num_cached_blocks(static_cast<uint32_t>(target.first_block));
  for (BlockId b : wire_blocks) {
    req.add_target_block_ids(b.value());
  }
  req.set_transport(std::string(ctx_->handoff->backend()));
  req.set_transport_endpoint(ctx_->handoff->endpoint());
  req.set_transport_descriptor(expectation.descriptor);
  req.set_transfer_tag(tag);
  req.set_decode_worker_id(ctx_->worker_id);
  req.set_cache_salt(decode_->cache_salt());
  *req.mutable_resume() = decode_->resume();
  if (!target.kv_policy.policy.empty()) {
    req.set_kv_policy(target.kv_policy.policy);
    req.set_kv_budget_tokens(static_cast<uint32_t>(target.kv_policy.budget_tokens));
    req.set_kv_recent_tokens(static_cast<uint32_t>(target.kv_policy.recent_tokens));
  }
  return req;
}

void RemotePrefill::OnPeerAnswer(const absl::Status& status, const iv1::PrefillResponse& response) {
  uint64_t bytes = 0;
  std::optional<engine::TokenLogprob> first_logprob;
  if (response.has_first_logprob()) {
    first_logprob = TokenLogprobFromProto(response.first_logprob());
  }
  {
    absl::MutexLock lock(&mu_);
    if (state_ != State::kCalling) {
      return;  // already failed (transfer error or deadline): the answer comes too late
    }
    if (!status.ok()) {
      state_ = State::kFailed;
    } else {
      stats_->kv_transfer_us = response.timings().kv_transfer_us();
      stats_->prefill_cached_tokens = response.prefill_cached_tokens();
      stats_->prefill_tier_cached_tokens = response.prefill_tier_cached_tokens();
      stats_->kv_restore_us = response.timings().kv_restore_us();
      first_token_ = response.first_token_id();
      kept_tokens_ = response.kv_kept_tokens();
      if (!transfer_done_) {
        first_logprob_ = std::move(first_logprob);
        state_ = State::kAwaitingTransfer;
        return;
      }
      state_ = State::kDone;
      bytes = transfer_bytes_;
    }
  }
  if (!status.ok()) {
    Fail(status, /*cancel_expectation=*/true);
  } else {
    Complete(response.first_token_id(), std::move(first_logprob), response.kv_kept_tokens(),
             bytes);
  }
}

void RemotePrefill::OnTransfer(const transport::TransferState& st) {
  uint32_t first = 0;
  int64_t kept = 0;
  std::optional<engine::TokenLogprob> first_logprob;
  {
    absl::MutexLock lock(&mu_);
    if (state_ == State::kDone || state_ == State::kFailed) {
      return;
    }
    if (st.phase != transport::TransferPhase::kDone) {
      state_ = State::kFailed;
    } else if (state_ == State::kCalling) {
      transfer_done_ = true;  // the answer completes it
      transfer_bytes_ = st.bytes;
      return;
    } else {
      state_ = State::kDone;
      first = first_token_;
      kept = kept_tokens_;
      first_logprob = std::move(first_logprob_);
    }
  }
  if (st.phase != transport::TransferPhase::kDone) {
    Fail(st.status, /*cancel_expectation=*/true);
  } else {
    Complete(first, std::move(first_logprob), kept, st.bytes);
  }
}

void RemotePrefill::Complete(uint32_t first_token,
                             std::optional<engine::TokenLogprob> first_logprob,
                             int64_t kept_tokens, uint64_t bytes) {
  ctx_->metrics.kv_transfer_bytes->WithLabels({"in"}).Increment(bytes);
  ctx_->loop->Post([ctx = ctx_, id = id_, request_id = decode_->request_id(), first_token,
                    first_logprob = std::move(first_logprob),
                    kept_tokens](engine::Scheduler& s) mutable {
    const absl::Status done =
        s.CompleteRemotePrefill(id, first_token, std::move(first_logprob), kept_tokens);
    if (done.ok()) {
      ctx->metrics.prefills->WithLabels({"remote"}).Increment();
      return;
    }
    LOG(WARNING) << "request_id=" << request_id << ": " << done;
    if (done.code() == absl::StatusCode::kInvalidArgument) {
      // The prefill worker's answer was refused (a first token or logprob entry out of range):
      // the scheduler prefills the request locally instead.
      ctx->metrics.prefills->WithLabels({"fallback"}).Increment();
    }
  });
}

void RemotePrefill::Fail(const absl::Status& why, bool cancel_expectation) {
  if (cancel_expectation) {
    TransferId expectation;
    {
      absl::MutexLock lock(&mu_);
      expectation = expectation_;
    }
    // Returns once no write into the blocks is in progress: the local prefill may use them.
    (void)ctx_->handoff->Cancel(expectation);
  }
  LOG(WARNING) << "request_id=" << decode_->request_id()
               << ": remote prefill failed, prefilling locally: " << why;
  ctx_->metrics.prefills->WithLabels({"fallback"}).Increment();
  ctx_->loop->Post([id = id_](engine::Scheduler& s) { (void)s.FailRemotePrefill(id); });
}

}  // namespace pd::worker
