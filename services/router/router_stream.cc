#include "services/router/router_stream.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/hash/block_hash.h"
#include "common/log/log.h"
#include "services/base/grpc_status.h"

namespace pd::router {

namespace iv1 = pdserve::internal::v1;
namespace v1 = pdserve::v1;

namespace {

// Marks a read's buffer before the read: gRPC parses an arrived message into the buffer, and
// protobuf clears a message before parsing into it, so a failed read whose buffer still holds
// the mark received no message (the stream ended, or the call failed: its status follows),
// while one without it received a message that does not parse. No worker reports this time.
constexpr uint64_t kNoMessageMark = std::numeric_limits<uint64_t>::max();

void MarkUnread(iv1::DecodeResponse* in) {
  in->Clear();
  in->mutable_timings()->set_total_us(kNoMessageMark);
}

bool ReceivedAMessage(const iv1::DecodeResponse& in) {
  return in.timings().total_us() != kNoMessageMark;
}

}  // namespace

// One DecodeService.Generate call's reactor: forwards its reactions to the stream.
class RouterStream::Upstream final : public grpc::ClientReadReactor<iv1::DecodeResponse> {
 public:
  Upstream(RouterStream* s, Attempt* a) : s_(s), a_(a) {}
  void OnReadDone(bool ok) override { s_->OnUpstreamRead(a_, ok); }
  void OnDone(const grpc::Status& status) override {
    s_->OnUpstreamDone(a_, services::FromGrpcStatus(status));
  }

 private:
  RouterStream* s_;
  Attempt* a_;
};

// One DecodeService.Generate call.
struct RouterStream::Attempt {
  Attempt(RouterStream* s, Placement p) : placement(std::move(p)), upstream(s, this) {}
  const Placement placement;
  grpc::ClientContext ctx;
  Upstream upstream;
  iv1::DecodeResponse in;
};

void RouterStreamMetrics::CountRequest(absl::string_view method, absl::StatusCode code) const {
  requests->WithLabels({std::string(method), absl::StatusCodeToString(code)}).Increment();
}

RouterStream::RouterStream(RouterStreamHost* host, StreamSink* sink, iv1::DecodeRequest decode,
                           Placement placement, absl::Time deadline)
    : host_(host),
      sink_(sink),
      decode_(std::move(decode)),
      deadline_(deadline),
      received_(absl::Now()),
      first_placement_(std::move(placement)) {}

RouterStream::~RouterStream() {
  bool release;
  {
    absl::MutexLock lock(&mu_);
    release = !tenant_released_;  // normally released by MaybeFinishLocked already
    tenant_released_ = true;
  }
  if (release) {
    host_->ReleaseStream(decode_.tenant());
  }
}

int RouterStream::decode_index() {
  absl::MutexLock lock(&mu_);
  return attempt_ != nullptr ? attempt_->placement.decode_index : first_placement_.decode_index;
}

void RouterStream::Start() {
  Attempt* a;
  bool cancelled;
  {
    absl::MutexLock lock(&mu_);
    a = NewAttemptLocked(std::move(first_placement_));
    cancelled = cancelled_by_client_;
  }
  Launch(a);
  if (cancelled) {
    a->ctx.TryCancel();  // Cancel came first; attempts live as long as this stream
  }
}

void RouterStream::OnSent(bool ok) {
  std::optional<absl::Status> finish;
  Attempt* cancel = nullptr;
  {
    absl::MutexLock lock(&mu_);
    writing_ = false;
    if (!ok) {
      cancelled_by_client_ = true;
      cancel = attempt_.get();  // the client is gone: stop the worker
    } else if (!upstream_done_) {
      MarkUnread(&attempt_->in);
      attempt_->upstream.StartRead(&attempt_->in);
    }
    finish = MaybeFinishLocked();
  }
  if (cancel != nullptr) {
    cancel->ctx.TryCancel();
    cancel->upstream.RemoveHold();  // no read will follow (see Launch)
  }
  // Outside the lock: the sink's owner may destroy this stream as soon as End is called.
  if (finish.has_value()) {
    sink_->End(*finish);
  }
}

void RouterStream::Cancel() {
  Attempt* attempt;
  {
    absl::MutexLock lock(&mu_);
    cancelled_by_client_ = true;
    attempt = attempt_.get();
  }
  if (attempt != nullptr) {
    attempt->ctx.TryCancel();  // attempts live as long as this stream
  }
}

// Makes `placement` the current attempt; Launch (outside mu_: gRPC may run a reaction inline)
// then starts its call.
RouterStream::Attempt* RouterStream::NewAttemptLocked(Placement placement) {
  WorkerPool* pool = host_->workers();
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
void RouterStream::Launch(Attempt* a) {
  host_->workers()
      ->decode_stub(a->placement.decode_index)
      ->async()
      ->Generate(&a->ctx, &decode_, &a->upstream);
  // The next read is started from OnSent, outside the upstream's reactions: without a hold,
  // the call could finish (and free its state) between a read's end and that StartRead.
  // Released when no read will follow: a read that ends the stream, or a failed client write.
  a->upstream.AddHold();
  MarkUnread(&a->in);
  a->upstream.StartRead(&a->in);
  a->upstream.StartCall();
}

void RouterStream::EndAttemptLocked(const Attempt& a) {
  WorkerPool* pool = host_->workers();
  pool->AddInflight(a.placement.decode_index, -1, a.placement.new_blocks);
  if (a.placement.prefill_index >= 0) {
    pool->AddInflight(a.placement.prefill_index, -1);
  }
}

void RouterStream::OnUpstreamRead(Attempt* a, bool ok) {
  if (!ok) {
    // End of stream: OnDone follows with the status. Before the final message it may also be
    // a message that failed to parse; gRPC then delivers the status only after every remaining
    // message was read, which never happens: cancel so OnDone comes. Only then: cancelling a
    // stream that merely ended could replace the worker's status (UNAVAILABLE, to be retried)
    // with CANCELLED.
    bool cancel = false;
    {
      absl::MutexLock lock(&mu_);
      cancel = read_failed_ = !got_final_ && ReceivedAMessage(a->in);
    }
    if (cancel) {
      a->ctx.TryCancel();
    }
    a->upstream.RemoveHold();  // no read follows: OnDone may come
    return;
  }
  bool skip = false;
  {
    absl::MutexLock lock(&mu_);
    const iv1::DecodeResponse& in = a->in;
    host_->workers()->NoteActivity(a->placement.decode_index);
    out_.Clear();
    *out_.mutable_token_ids() = in.token_ids();
    out_.set_text(in.text());
    *out_.mutable_logprobs() = in.logprobs();
    completion_tokens_ += in.token_ids_size();
    streamed_.insert(streamed_.end(), in.token_ids().begin(), in.token_ids().end());
    text_offset_ = in.text_offset();
    if (in.token_ids_size() > 0) {
      const absl::Time now = absl::Now();
      if (moved_after_ != absl::InfinitePast()) {
        host_->stream_metrics().migration_stall->WithLabels({}).Observe(
            absl::ToDoubleSeconds(now - moved_after_));
        moved_after_ = absl::InfinitePast();
      }
      if (!first_) {
        // Inter-token latency as the client sees it: one observation per message after the
        // first, spread over the tokens it carries.
        const double gap = absl::ToDoubleSeconds(now - last_token_) / in.token_ids_size();
        metrics::Histogram& itl = host_->stream_metrics().itl->WithLabels({});
        for (int i = 0; i < in.token_ids_size(); ++i) {
          itl.Observe(gap);
        }
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
    // A failed worker may send ABORT or ERROR with its last tokens: failures end the client's
    // stream with a status (or the stream moves on), never with a finish reason.
    const bool finished = in.finish_reason() == v1::FINISH_REASON_STOP ||
                          in.finish_reason() == v1::FINISH_REASON_LENGTH ||
                          in.finish_reason() == v1::FINISH_REASON_STOP_STRING;
    skip = !finished && in.token_ids_size() == 0 && in.text().empty();
    if (finished) {
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
    if (!skip) {
      relayed_ = true;
      writing_ = true;
    }
  }
  if (skip) {
    // Nothing for the client (an empty ABORT/ERROR message): read on, from this reaction.
    MarkUnread(&a->in);
    a->upstream.StartRead(&a->in);
    return;
  }
  // out_ is not touched again before OnSent (the next read starts there).
  sink_->Send(out_);
}

void RouterStream::OnUpstreamDone(Attempt* a, const absl::Status& status) {
  std::optional<absl::Status> finish;
  Attempt* retry = nullptr;
  {
    absl::MutexLock lock(&mu_);
    EndAttemptLocked(*a);
    if (status.code() == absl::StatusCode::kUnavailable) {
      // The worker died or is unreachable: no new requests until it answers health checks.
      host_->workers()->MarkFailed(a->placement.decode_index, status);
      if (!cancelled_by_client_ && !got_final_ && absl::Now() < deadline_) {
        if (!relayed_) {
          retry = attempts_ < kMaxAttempts ? Retry(status) : nullptr;
        } else {
          retry = Migrate(status);
        }
      }
    }
  }
  if (retry != nullptr) {
    // Nothing of this stream is touched after Launch: the call may end, and the sink's owner
    // delete the stream, before it returns. A Cancel in between cancels the new attempt's
    // context, which gRPC applies when the call starts.
    Launch(retry);
    return;
  }
  {
    absl::MutexLock lock(&mu_);
    upstream_done_ = true;
    status_ = status;
    if (read_failed_ && status.code() == absl::StatusCode::kCancelled && !cancelled_by_client_) {
      status_ = absl::InternalError("decode worker sent a message the router cannot read");
    }
    finish = MaybeFinishLocked();
  }
  if (finish.has_value()) {
    sink_->End(*finish);
  }
}

// Places the request again (the failed worker is out of the pool now): the new attempt to
// Launch, or null when no worker can take it.
RouterStream::Attempt* RouterStream::Retry(const absl::Status& why) {
  absl::StatusOr<std::vector<BlockHash>> chain = SplitBlockHashes(decode_.block_hashes());
  if (!chain.ok()) {
    return nullptr;
  }
  std::vector<WorkerSnapshot> workers = host_->workers()->Snapshot();
  absl::StatusOr<Placement> p = host_->policy()->Choose(*chain, decode_.token_ids_size(), workers);
  if (!p.ok()) {
    return nullptr;
  }
  if (p->prefill_index >= 0) {
    decode_.set_prefill_address(workers[p->prefill_index].address);
  } else {
    decode_.clear_prefill_address();
  }
  LOG(WARNING) << "request_id=" << decode_.request_id() << ": decode worker failed before "
               << "the first token (" << why.message() << "); retrying on worker "
               << p->decode_index;
  host_->stream_metrics().retries->WithLabels({}).Increment();
  return NewAttemptLocked(*std::move(p));
}

// Moves the stream to another decode worker after its own failed with `why` mid-stream (the
// failed one is out of the pool now): the request with what reached the client as its resume
// state. The new attempt to Launch, or null (not_moved_ says why) when the budget is spent or
// no worker can take it.
RouterStream::Attempt* RouterStream::Migrate(const absl::Status& why) {
  const std::string reason =
      absl::StrContains(why.message(), services::kWorkerDrainingMessage) ? "drain" : "failure";
  metrics::Family<metrics::Counter>* counter = host_->stream_metrics().migrations;
  if (migrations_ >= host_->max_migrations()) {
    not_moved_ = absl::StrCat("; not moved: the stream already moved ", migrations_,
                              " times (--max_migrations)");
    counter->WithLabels({reason, "budget_spent"}).Increment();
    return nullptr;
  }
  std::vector<uint32_t> tokens(decode_.token_ids().begin(), decode_.token_ids().end());
  tokens.insert(tokens.end(), streamed_.begin(), streamed_.end());
  absl::StatusOr<std::vector<BlockHash>> chain = host_->BlockHashesOf(decode_.cache_salt(), tokens);
  const std::vector<WorkerSnapshot> workers = host_->workers()->Snapshot();
  absl::StatusOr<Placement> p =
      chain.ok() ? host_->policy()->Choose(*chain, static_cast<int64_t>(tokens.size()), workers)
                 : absl::StatusOr<Placement>(chain.status());
  if (!p.ok()) {
    not_moved_ = absl::StrCat("; not moved: no decode worker can take the stream over (",
                              p.status().message(), ")");
    counter->WithLabels({reason, "no_worker"}).Increment();
    return nullptr;
  }
  // The resumed prompt (prompt + streamed tokens) is placed as any prompt: restored from the
  // tiers, computed by a prefill worker, or by the decode worker.
  pdserve::internal::v1::ResumeState* resume = decode_.mutable_resume();
  resume->mutable_token_ids()->Assign(streamed_.begin(), streamed_.end());
  resume->set_text_offset(text_offset_);
  decode_.set_block_hashes(ConcatBlockHashes(*chain));
  if (p->prefill_index >= 0) {
    decode_.set_prefill_address(workers[p->prefill_index].address);
  } else {
    decode_.clear_prefill_address();
  }
  const absl::Time now = absl::Now();
  if (decode_.timeout_ms() > 0 && deadline_ != absl::InfiniteFuture()) {
    decode_.set_timeout_ms(
        static_cast<uint32_t>(std::max<int64_t>(1, absl::ToInt64Milliseconds(deadline_ - now))));
  }
  ++migrations_;
  moved_after_ = last_token_ != absl::InfinitePast() ? last_token_ : now;
  LOG(WARNING) << "request_id=" << decode_.request_id() << ": decode worker "
               << attempt_->placement.decode_index << " failed after " << streamed_.size()
               << " tokens (" << why.message() << "); the stream moves to worker "
               << p->decode_index << " (move " << migrations_ << " of at most "
               << host_->max_migrations() << ")";
  counter->WithLabels({reason, "moved"}).Increment();
  return NewAttemptLocked(*std::move(p));
}

// The status to end the client stream with, once the worker call is done and no write is in
// flight; nullopt otherwise (and after it was returned once).
std::optional<absl::Status> RouterStream::MaybeFinishLocked() {
  if (!upstream_done_ || writing_ || finished_) {
    return std::nullopt;
  }
  finished_ = true;
  if (!tenant_released_) {
    tenant_released_ = true;
    host_->ReleaseStream(decode_.tenant());  // before the client sees the end
  }
  absl::Status final_status = status_;
  if (status_.ok() && !got_final_) {
    final_status = absl::InternalError("decode worker ended the stream without a finish reason");
  }
  if (got_final_ && status_.code() == absl::StatusCode::kUnavailable) {
    // The worker died after its last message (the finish reason) and before the call's
    // status: the client has the whole stream, so it ends OK (the soak test lost such a stream).
    final_status = absl::OkStatus();
  } else if (status_.code() == absl::StatusCode::kUnavailable) {
    final_status = absl::UnavailableError(
        absl::StrCat("decode worker failed: ", status_.message(), not_moved_, " (retry)"));
  }
  const RouterStreamMetrics& m = host_->stream_metrics();
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
  m.CountRequest("Generate", final_status.code());
  VLOG(1) << "request_id=" << decode_.request_id() << " done: " << final_status.message();
  return final_status;
}

}  // namespace pd::router
