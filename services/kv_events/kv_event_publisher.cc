// Locking: one mutex (mu_) guards the log, the streams and their state. StartWrite and Finish
// are called under it: neither runs a reaction inline (gRPC schedules OnWriteDone and OnDone on
// its own threads), and OnDone, which deletes the stream, first takes mu_ to unregister it, so
// a stream is never touched after it was deleted. Building a snapshot's chunks (the costly
// part of a subscription) happens outside the lock, on the held set copied under it.
#include "services/kv_events/kv_event_publisher.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <deque>
#include <utility>
#include <vector>

#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "common/log/log.h"
#include "services/base/grpc_status.h"

namespace pd::kv_events {
namespace {

namespace iv1 = pdserve::internal::v1;

// Ends a stream at once with `status` (no messages).
class RejectedStream final : public grpc::ServerWriteReactor<iv1::KvEventBatch> {
 public:
  explicit RejectedStream(const absl::Status& status) { Finish(services::ToGrpcStatus(status)); }
  void OnDone() override { delete this; }  // gRPC's reactor ownership contract
};

uint64_t NewEpoch() {
  absl::BitGen gen;
  uint64_t epoch = 0;
  while (epoch == 0) {
    epoch = absl::Uniform<uint64_t>(gen);
  }
  return epoch;
}

}  // namespace

// One Subscribe stream. Every field is guarded by the publisher's mu_ (not annotated: the
// analysis cannot name another object's mutex here).
class KvEventPublisher::Stream final : public grpc::ServerWriteReactor<iv1::KvEventBatch> {
 public:
  Stream(KvEventPublisher* publisher, std::string who)
      : publisher_(publisher), who_(std::move(who)) {}

  void OnWriteDone(bool ok) override { publisher_->OnStreamWriteDone(this, ok); }
  void OnCancel() override { publisher_->OnStreamCancel(this); }
  void OnDone() override {
    publisher_->OnStreamDone(this);
    delete this;
  }

  KvEventPublisher* const publisher_;
  const std::string who_;  // subscriber id and peer, for logs
  // Snapshot chunks not yet written.
  std::deque<iv1::KvEventBatch> snapshot_;
  // Sequence number of the last event written (or being written); the snapshot's sequence or
  // the replay's from_sequence before any.
  uint64_t cursor_ = 0;
  bool preparing_ = false;  // the snapshot is being built: no writes yet
  bool writing_ = false;
  bool cancelled_ = false;  // the subscriber is gone: finish once no write is in flight
  bool finished_ = false;
  absl::Status end_;  // what Finish was called with
  absl::Time last_write_ = absl::InfinitePast();
  iv1::KvEventBatch current_;  // the message being written
};

absl::Status KvEventPublisherConfig::Validate() const {
  KvEventLogConfig log{history_events, history_bytes, block_size};
  if (absl::Status s = log.Validate(); !s.ok()) {
    return s;
  }
  if (max_batch_events <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_batch_events is ", max_batch_events, ", want > 0"));
  }
  if (heartbeat_interval <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "heartbeat_interval is ", absl::FormatDuration(heartbeat_interval), ", want > 0"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<KvEventPublisher>> KvEventPublisher::Create(
    KvEventPublisherConfig config) {
  if (absl::Status s = config.Validate(); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("kv event publisher: ", s.message()));
  }
  std::unique_ptr<KvEventPublisher> p(new KvEventPublisher(std::move(config), NewEpoch()));
  p->pump_ = std::thread([raw = p.get()] { raw->PumpLoop(); });
  return p;
}

KvEventPublisher::KvEventPublisher(KvEventPublisherConfig config, uint64_t epoch)
    : config_(std::move(config)),
      epoch_(epoch),
      worker_id_(config_.worker_id),
      log_(epoch,
           KvEventLogConfig{config_.history_events, config_.history_bytes, config_.block_size}) {}

KvEventPublisher::~KvEventPublisher() {
  Shutdown();
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(
      +[](absl::flat_hash_set<Stream*>* streams) { return streams->empty(); }, &streams_));
}

void KvEventPublisher::SetWorkerId(absl::string_view worker_id) {
  absl::MutexLock lock(&mu_);
  worker_id_ = std::string(worker_id);
}

void KvEventPublisher::OnBlocksStored(absl::Span<const BlockHash> hashes,
                                      std::optional<BlockHash> parent) {
  absl::MutexLock lock(&mu_);
  NotifyLocked(log_.Stored(hashes, parent));
}

void KvEventPublisher::OnBlocksRemoved(absl::Span<const BlockHash> hashes) {
  absl::MutexLock lock(&mu_);
  NotifyLocked(log_.Removed(hashes));
}

void KvEventPublisher::OnAllCleared() {
  absl::MutexLock lock(&mu_);
  NotifyLocked(log_.Cleared());
}

void KvEventPublisher::NotifyLocked(int n) {
  stats_.events_published += n;
  if (n > 0) {
    wake_pump_ = true;
  }
}

grpc::ServerWriteReactor<iv1::KvEventBatch>* KvEventPublisher::Subscribe(
    grpc::CallbackServerContext* context, const iv1::SubscribeRequest* request) {
  const std::string who =
      absl::StrCat(request->subscriber_id().empty() ? "(unnamed)" : request->subscriber_id(),
                   " at ", context->peer());
  StreamStart start;
  std::vector<HeldBlock> held;
  std::string worker_id;
  auto* stream = new Stream(this, who);
  {
    absl::MutexLock lock(&mu_);
    // Checked first: a caller without the cluster token learns nothing, not even readiness.
    absl::Status refused = config_.cluster_auth.Check(*context, "KvEventService.Subscribe");
    if (refused.ok() && shutting_down_) {
      refused = absl::UnavailableError(
          absl::StrCat("kv event publisher of worker ", worker_id_, " is shutting down"));
    } else if (refused.ok() && worker_id_.empty()) {
      refused = absl::UnavailableError("kv event publisher is not ready: worker id not set yet");
    }
    if (!refused.ok()) {
      delete stream;
      return new RejectedStream(refused);
    }
    worker_id = worker_id_;
    start = log_.Resume(request->epoch(), request->from_sequence());
    stream->cursor_ = start.sequence;
    ++stats_.subscriptions;
    if (start.replay()) {
      ++stats_.replays;
    } else {
      ++stats_.snapshots_sent;
      // Copied under the same lock as its sequence number: the snapshot is exactly the state
      // after event start.sequence, and the stream's events continue from there.
      held = log_.HeldBlocks();
      stream->preparing_ = true;
    }
    streams_.insert(stream);
    // No reaction can run before this handler returns the reactor (gRPC binds it afterwards;
    // StartWrite and Finish called before are queued), so `stream` stays valid below.
    MaybeWriteLocked(stream, absl::Now());
  }
  LOG(INFO) << "kv events: subscriber " << who << " asked for (epoch " << request->epoch()
            << ", after " << request->from_sequence()
            << "): " << (start.replay() ? "replay" : iv1::SnapshotReason_Name(start.reason))
            << " from " << start.sequence
            << (start.replay() ? "" : absl::StrCat(", ", held.size(), " blocks"));
  if (!start.replay()) {
    std::vector<iv1::KvEventBatch> chunks = BuildSnapshotBatches(
        worker_id, epoch_, start.sequence, start.reason, std::move(held), config_.block_size);
    absl::MutexLock lock(&mu_);
    for (iv1::KvEventBatch& chunk : chunks) {
      stream->snapshot_.push_back(std::move(chunk));
    }
    stream->preparing_ = false;
    MaybeWriteLocked(stream, absl::Now());
  }
  return stream;
}

void KvEventPublisher::MaybeWriteLocked(Stream* s, absl::Time now) {
  if (s->finished_ || s->writing_ || s->preparing_) {
    return;
  }
  if (s->cancelled_) {
    FinishLocked(s, absl::CancelledError("subscriber cancelled"));
    return;
  }
  if (shutting_down_) {
    FinishLocked(s, absl::UnavailableError(absl::StrCat("kv event publisher of worker ", worker_id_,
                                                        " is shutting down")));
    return;
  }
  if (paused_) {
    return;
  }
  iv1::KvEventBatch& b = s->current_;
  if (!s->snapshot_.empty()) {
    b = std::move(s->snapshot_.front());
    s->snapshot_.pop_front();
    ++stats_.snapshot_chunks_sent;
  } else if (s->cursor_ < log_.last_sequence()) {
    b.Clear();
    b.set_worker_id(worker_id_);
    b.set_epoch(epoch_);
    absl::StatusOr<int> n = log_.CopyEvents(s->cursor_, config_.max_batch_events, kMaxBatchBytes,
                                            worker_id_, b.mutable_events());
    if (!n.ok()) {
      ++stats_.streams_fell_behind;
      LOG(WARNING) << "kv events: subscriber " << s->who_
                   << " fell behind: " << n.status().message()
                   << "; ending its stream so that it resubscribes";
      FinishLocked(s, absl::AbortedError(absl::StrCat(
                          "subscriber fell behind: ", n.status().message(), "; resubscribe")));
      return;
    }
    s->cursor_ += static_cast<uint64_t>(*n);
  } else if (now - s->last_write_ >= config_.heartbeat_interval) {
    b.Clear();
    b.set_worker_id(worker_id_);
    b.set_epoch(epoch_);
    ++stats_.heartbeats_sent;
  } else {
    return;
  }
  ++stats_.batches_sent;
  s->writing_ = true;
  s->StartWrite(&b);
}

void KvEventPublisher::FinishLocked(Stream* s, absl::Status status) {
  s->finished_ = true;
  s->snapshot_.clear();
  s->end_ = status;
  s->Finish(services::ToGrpcStatus(status));
}

void KvEventPublisher::OnStreamWriteDone(Stream* s, bool ok) {
  absl::MutexLock lock(&mu_);
  const absl::Time now = absl::Now();
  s->writing_ = false;
  s->last_write_ = now;
  if (!ok) {
    s->cancelled_ = true;  // the subscriber is gone
  }
  MaybeWriteLocked(s, now);
}

void KvEventPublisher::OnStreamCancel(Stream* s) {
  absl::MutexLock lock(&mu_);
  s->cancelled_ = true;
  MaybeWriteLocked(s, absl::Now());
}

void KvEventPublisher::OnStreamDone(Stream* s) {
  absl::Status end;
  {
    absl::MutexLock lock(&mu_);
    streams_.erase(s);
    end = s->end_;
  }
  LOG(INFO) << "kv events: subscriber " << s->who_ << " left: " << end;
}

void KvEventPublisher::Shutdown() {
  std::thread pump;
  {
    absl::MutexLock lock(&mu_);
    if (!shutting_down_) {
      shutting_down_ = true;
      stop_pump_ = true;
      LOG(INFO) << "kv events: publisher of worker " << worker_id_ << " shutting down, ending "
                << streams_.size() << " streams";
      const absl::Time now = absl::Now();
      for (Stream* s : streams_) {
        MaybeWriteLocked(s, now);
      }
    }
    pump = std::move(pump_);
  }
  if (pump.joinable()) {
    pump.join();
  }
}

bool KvEventPublisher::PumpShouldWake() const {
  return stop_pump_ || (wake_pump_ && !streams_.empty());
}

void KvEventPublisher::PumpLoop() {
  absl::MutexLock lock(&mu_);
  while (!stop_pump_) {
    const absl::Time now = absl::Now();
    wake_pump_ = false;
    absl::Time next = now + config_.heartbeat_interval;
    for (Stream* s : streams_) {
      MaybeWriteLocked(s, now);
      if (!paused_ && !s->writing_ && !s->finished_ && !s->preparing_) {
        // Still idle: nothing to send and its heartbeat is not due before this.
        next = std::min(next, s->last_write_ + config_.heartbeat_interval);
      }
    }
    mu_.AwaitWithDeadline(absl::Condition(this, &KvEventPublisher::PumpShouldWake), next);
  }
}

KvEventPublisherStats KvEventPublisher::Stats() const {
  absl::MutexLock lock(&mu_);
  KvEventPublisherStats s = stats_;
  s.epoch = epoch_;
  s.last_sequence = log_.last_sequence();
  s.held_blocks = log_.num_held();
  s.history_events = log_.num_history_events();
  s.subscribers = static_cast<int64_t>(streams_.size());
  return s;
}

std::vector<HeldBlock> KvEventPublisher::HeldBlocksForTest() const {
  absl::MutexLock lock(&mu_);
  return log_.HeldBlocks();
}

void KvEventPublisher::PauseWritesForTest(bool paused) {
  absl::MutexLock lock(&mu_);
  paused_ = paused;
  if (!paused) {
    const absl::Time now = absl::Now();
    for (Stream* s : streams_) {
      MaybeWriteLocked(s, now);
    }
  }
}

}  // namespace pd::kv_events
