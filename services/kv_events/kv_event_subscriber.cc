// The stream thread drives one Subscribe call at a time through a ClientReadReactor with one
// read in flight: OnReadDone only flags the batch as ready; the thread checks and applies it,
// then starts the next read. Reads are started outside the reactions, hence the hold that keeps
// OnDone back until the thread lets go of the call (RemoveHold), after its last read returned.
#include "services/kv_events/kv_event_subscriber.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <utility>

#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "common/log/log.h"
#include "services/base/grpc_status.h"

namespace pd::kv_events {
namespace {

namespace iv1 = pdserve::internal::v1;

// Failed attempts in a row logged at WARNING: the first, then one in this many.
constexpr int64_t kLogEveryFailures = 20;

}  // namespace

class KvEventSubscriber::Call final : public grpc::ClientReadReactor<iv1::KvEventBatch> {
 public:
  Call(absl::Mutex* mu, const bool* stopping) : mu_(mu), stopping_(stopping) {}

  void OnReadDone(bool ok) override {
    absl::MutexLock lock(mu_);
    read_pending_ = false;
    read_ok_ = ok;
  }
  void OnDone(const grpc::Status& status) override {
    absl::MutexLock lock(mu_);
    status_ = status;
    done_ = true;
  }

  // Conditions, evaluated under *mu_.
  bool ReadDoneOrStopping() const { return !read_pending_ || *stopping_; }
  bool ReadDone() const { return !read_pending_; }
  bool Done() const { return done_; }

  grpc::ClientContext context;
  iv1::SubscribeRequest request;
  iv1::KvEventBatch batch;  // the read's destination; the thread's while no read is pending

  // Guarded by *mu_.
  bool read_pending_ = false;
  bool read_ok_ = false;
  bool done_ = false;
  grpc::Status status_;

 private:
  absl::Mutex* const mu_;
  const bool* const stopping_;
};

absl::Status KvEventSubscriberConfig::Validate() const {
  if (address.empty()) {
    return absl::InvalidArgumentError("address is empty");
  }
  if (backoff_min <= absl::ZeroDuration() || backoff_max < backoff_min) {
    return absl::InvalidArgumentError(
        absl::StrCat("backoff_min ", absl::FormatDuration(backoff_min), " and backoff_max ",
                     absl::FormatDuration(backoff_max), ": want 0 < backoff_min <= backoff_max"));
  }
  if (idle_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("idle_timeout is ", absl::FormatDuration(idle_timeout), ", want > 0"));
  }
  if (!on_batch) {
    return absl::InvalidArgumentError("on_batch is not set");
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<KvEventSubscriber>> KvEventSubscriber::Start(
    KvEventSubscriberConfig config) {
  if (absl::Status s = config.Validate(); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("kv event subscriber: ", s.message()));
  }
  std::unique_ptr<KvEventSubscriber> s(new KvEventSubscriber(std::move(config)));
  {
    absl::MutexLock lock(&s->join_mu_);
    s->thread_ = std::thread([raw = s.get()] { raw->Run(); });
  }
  return s;
}

KvEventSubscriber::KvEventSubscriber(KvEventSubscriberConfig config) : config_(std::move(config)) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(16 << 20);
  // The channel's own reconnection follows the subscriber's backoff, so that a restarted
  // publisher is found again within about backoff_min instead of gRPC's default 1 s..120 s.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS,
              static_cast<int>(absl::ToInt64Milliseconds(config_.backoff_min)));
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS,
              static_cast<int>(absl::ToInt64Milliseconds(config_.backoff_min)));
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS,
              static_cast<int>(absl::ToInt64Milliseconds(config_.backoff_max)));
  const std::shared_ptr<const services::ClientSecurity> security =
      config_.security != nullptr ? config_.security : services::ClientSecurity::Insecure();
  stub_ = iv1::KvEventService::NewStub(security->CreateChannel(config_.address, args));
  if (config_.resume_sequence > 0 && config_.resume_epoch != 0) {
    synced_ = true;
    epoch_ = config_.resume_epoch;
    last_sequence_ = config_.resume_sequence;
    stats_.epoch = epoch_;
    stats_.last_sequence = last_sequence_;
  }
}

KvEventSubscriber::~KvEventSubscriber() { Stop(); }

void KvEventSubscriber::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  absl::MutexLock lock(&join_mu_);  // concurrent Stop calls: one joins, all return after it
  if (thread_.joinable()) {
    thread_.join();
  }
}

KvEventSubscriberStats KvEventSubscriber::Stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

void KvEventSubscriber::Run() {
  absl::BitGen gen;
  absl::Duration backoff = config_.backoff_min;
  int64_t failures = 0;  // attempts in a row that delivered nothing
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      if (stopping_) {
        return;
      }
    }
    const StreamEnd end = RunStream();
    {
      absl::MutexLock lock(&mu_);
      if (stopping_) {
        return;
      }
      stats_.last_error = end.status;
    }
    const bool worked = end.delivered && !end.rejected;
    if (end.delivered) {
      LOG(WARNING) << "kv events from " << config_.address << ": stream ended: " << end.status
                   << "; resubscribing";
      if (config_.on_disconnect) {
        config_.on_disconnect(end.status);
      }
    } else if (failures % kLogEveryFailures == 0) {
      LOG(WARNING) << "kv events from " << config_.address << ": cannot subscribe (attempt "
                   << failures + 1 << "): " << end.status;
    }
    absl::Duration delay = config_.backoff_min;
    if (worked) {
      failures = 0;
      backoff = config_.backoff_min;
    } else {
      ++failures;
      delay = backoff;
      backoff = std::min(backoff * 2, config_.backoff_max);
    }
    // +-20% jitter, so that routers do not resubscribe in lockstep after a worker restart.
    delay *= absl::Uniform(gen, 0.8, 1.2);
    absl::MutexLock lock(&mu_);
    mu_.AwaitWithDeadline(absl::Condition(&stopping_), absl::Now() + delay);
  }
}

KvEventSubscriber::StreamEnd KvEventSubscriber::RunStream() {
  Call call(&mu_, &stopping_);
  {
    absl::MutexLock lock(&mu_);
    ++stats_.streams;
    if (stats_.streams > 1) {
      ++stats_.reconnects;
    }
    call.read_pending_ = true;
  }
  // A snapshot that did not complete left the consumer's state incomplete: start over.
  if (in_snapshot_) {
    in_snapshot_ = false;
    synced_ = false;
  }
  call.request.set_subscriber_id(config_.subscriber_id);
  if (synced_) {
    call.request.set_epoch(epoch_);
    call.request.set_from_sequence(last_sequence_);
  }
  stub_->async()->Subscribe(&call.context, &call.request, &call);
  call.AddHold();
  call.StartRead(&call.batch);
  call.StartCall();

  StreamEnd end;
  absl::Time last_batch = absl::Now();
  while (true) {
    bool stop = false;
    bool idle = false;
    {
      absl::MutexLock lock(&mu_);
      const bool woke = mu_.AwaitWithDeadline(absl::Condition(&call, &Call::ReadDoneOrStopping),
                                              last_batch + config_.idle_timeout);
      stop = stopping_;
      idle = !woke && !stop;
    }
    if (stop || idle) {
      if (idle) {
        end.status = absl::DeadlineExceededError(absl::StrCat(
            "no batch (not even a heartbeat) for ", absl::FormatDuration(config_.idle_timeout)));
      } else {
        end.status = absl::CancelledError("subscriber stopped");
      }
      call.context.TryCancel();
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(&call, &Call::ReadDone));
      break;
    }
    bool read_ok = false;
    {
      absl::MutexLock lock(&mu_);
      read_ok = call.read_ok_;
    }
    if (!read_ok) {
      break;  // the stream ended; OnDone has its status
    }
    if (!end.delivered) {
      LOG(INFO) << "kv events from " << config_.address << ": subscribed, epoch "
                << call.batch.epoch() << ", "
                << (call.batch.has_snapshot()
                        ? absl::StrCat("snapshot (",
                                       iv1::SnapshotReason_Name(call.batch.snapshot().reason()),
                                       ") at ", call.batch.snapshot().sequence())
                        : absl::StrCat("replay after ", last_sequence_));
    }
    absl::Status processed = Process(call.batch);
    if (!processed.ok()) {
      LOG(WARNING) << "kv events from " << config_.address << ": " << processed
                   << "; resubscribing from a snapshot";
      in_snapshot_ = false;
      synced_ = false;
      end.status = processed;
      end.rejected = true;
      {
        absl::MutexLock lock(&mu_);
        ++stats_.resyncs;
        stats_.connected = false;
      }
      call.context.TryCancel();
      break;
    }
    end.delivered = true;
    {
      absl::MutexLock lock(&mu_);
      stats_.connected = true;
      call.read_pending_ = true;
    }
    // From here, not from the batch's arrival: a slow consumer is not an idle publisher.
    last_batch = absl::Now();
    call.StartRead(&call.batch);
  }
  call.RemoveHold();
  grpc::Status status;
  {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(&call, &Call::Done));
    status = call.status_;
    stats_.connected = false;
  }
  if (end.status.ok()) {
    end.status = status.ok() ? absl::UnavailableError("publisher ended the stream")
                             : services::FromGrpcStatus(status);
  }
  return end;
}

absl::Status KvEventSubscriber::Process(const iv1::KvEventBatch& batch) {
  const int n = batch.events_size();
  if (batch.epoch() == 0) {
    return absl::InvalidArgumentError("batch with epoch 0");
  }
  uint64_t before_first = 0;  // sequence the batch's first event must follow
  if (batch.has_snapshot()) {
    const iv1::KvSnapshot& snap = batch.snapshot();
    if (!snap.complete() && n > 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(n, " events in a snapshot chunk that is not the last"));
    }
    if (!in_snapshot_ || snapshot_epoch_ != batch.epoch() ||
        snapshot_sequence_ != snap.sequence()) {
      // A new snapshot: the consumer drops its state on this chunk.
      in_snapshot_ = true;
      synced_ = false;
      snapshot_epoch_ = batch.epoch();
      snapshot_sequence_ = snap.sequence();
    }
    before_first = snap.sequence();
  } else if (in_snapshot_) {
    if (n > 0) {
      return absl::FailedPreconditionError(
          absl::StrCat(n, " events before the snapshot at ", snapshot_sequence_, " completed"));
    }
  } else if (synced_ && batch.epoch() != epoch_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "publisher epoch changed from ", epoch_, " to ", batch.epoch(), " without a snapshot"));
  } else if (!synced_ && n > 0) {
    return absl::FailedPreconditionError(
        absl::StrCat(n, " events without a snapshot while nothing is applied"));
  } else {
    before_first = last_sequence_;
  }
  for (int i = 0; i < n; ++i) {
    const uint64_t want = before_first + 1 + static_cast<uint64_t>(i);
    if (batch.events(i).sequence() != want) {
      return absl::DataLossError(absl::StrCat("sequence gap: expected event ", want, ", got ",
                                              batch.events(i).sequence(), " (epoch ", batch.epoch(),
                                              ")"));
    }
  }
  const bool heartbeat = !batch.has_snapshot() && n == 0;
  if (!heartbeat) {
    absl::Status applied = config_.on_batch(batch);
    if (!applied.ok()) {
      return absl::Status(applied.code(),
                          absl::StrCat("batch rejected by the consumer: ", applied.message()));
    }
  }
  bool completed = false;
  if (batch.has_snapshot() && batch.snapshot().complete()) {
    in_snapshot_ = false;
    synced_ = true;
    epoch_ = batch.epoch();
    last_sequence_ = batch.snapshot().sequence();
    completed = true;
  }
  if (n > 0) {
    last_sequence_ = batch.events(n - 1).sequence();
  }
  absl::MutexLock lock(&mu_);
  ++stats_.batches;
  stats_.heartbeats += heartbeat ? 1 : 0;
  stats_.snapshots += completed ? 1 : 0;
  stats_.events += n;
  if (synced_) {
    stats_.epoch = epoch_;
    stats_.last_sequence = last_sequence_;
  }
  return absl::OkStatus();
}

}  // namespace pd::kv_events
