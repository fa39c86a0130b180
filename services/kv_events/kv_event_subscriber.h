// KvEventSubscriber: follows one publisher's KV event stream (proto/pd/v1/kv_events.proto) and
// hands its batches, checked and in order, to a callback; the router runs one per worker and
// feeds KvIndex::Apply with it.
//
// It keeps the position (epoch, last applied sequence) and, whenever the stream breaks
// (publisher restart or shutdown, network, idle timeout), resubscribes from there after a
// backoff, so that the publisher replays what was missed or sends a snapshot. It resubscribes
// from 0 (a fresh snapshot) after the callback returned an error, after a protocol error (a
// sequence gap, an epoch change without a snapshot, events inside an incomplete snapshot), and
// when a stream broke in the middle of a snapshot.
//
// The callback sees every batch that carries a snapshot chunk or events, never a gap: for each
// publisher epoch, events arrive contiguous with the snapshot or with the previous batch. A
// snapshot chunk means what KvIndex::Apply says (the first chunk replaces the state). Empty
// batches (heartbeats) only prove the stream is alive and are not passed on.
//
// Thread-safety: thread-safe. One internal thread runs the stream; both callbacks run on it,
// one at a time, and must not call Stop() or destroy the subscriber.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "pd/v1/kv_events.grpc.pb.h"
#include "services/base/grpc_security.h"

namespace pd::kv_events {

struct KvEventSubscriberConfig {
  // Publisher's gRPC address ("host:port"); non-empty.
  std::string address;
  // Sent as SubscribeRequest.subscriber_id, for the publisher's logs. May be empty.
  std::string subscriber_id;
  // TLS and the cluster token of the channel to the publisher; null = plaintext, no token.
  std::shared_ptr<const services::ClientSecurity> security;
  // Delay before resubscribing, doubling after each attempt that failed (delivered nothing,
  // or a batch the subscriber rejected) from backoff_min up to backoff_max, back to
  // backoff_min after a stream that worked; 0 < backoff_min <= backoff_max.
  absl::Duration backoff_min = absl::Milliseconds(50);
  absl::Duration backoff_max = absl::Seconds(2);
  // A stream that delivers no batch (heartbeats included) for this long is cancelled and
  // resubscribed; > 0, and above the publisher's heartbeat_interval.
  absl::Duration idle_timeout = absl::Seconds(5);
  // Where to resume: the (epoch, last applied sequence) of an earlier subscriber (its Stats).
  // 0 = start with a snapshot.
  uint64_t resume_epoch = 0;
  uint64_t resume_sequence = 0;
  // Receives each batch carrying a snapshot chunk or events, in stream order. An error makes
  // the subscriber resubscribe from 0. Required.
  std::function<absl::Status(const pdserve::internal::v1::KvEventBatch&)> on_batch;
  // Called when a stream that had delivered a batch ends (not on Stop), with why it ended.
  // Optional. The router may use it to forget the worker if it does not come back.
  std::function<void(const absl::Status&)> on_disconnect;

  // InvalidArgument naming the field.
  absl::Status Validate() const;
};

// Counters since Start, and current state; plain values.
struct KvEventSubscriberStats {
  bool connected = false;      // the current stream has delivered a batch and is open
  int64_t streams = 0;         // Subscribe calls started
  int64_t reconnects = 0;      // Subscribe calls started after the first
  int64_t batches = 0;         // batches received, heartbeats included
  int64_t heartbeats = 0;      // empty batches received
  int64_t events = 0;          // events passed to on_batch
  int64_t snapshots = 0;       // complete snapshots passed to on_batch (not chunks)
  int64_t resyncs = 0;         // resubscriptions from 0 forced by an error
  uint64_t epoch = 0;          // epoch of the applied state; 0 before the first
  uint64_t last_sequence = 0;  // last applied sequence in `epoch`
  absl::Status last_error;     // why the last stream ended (OK before any ended)
};

class KvEventSubscriber {
 public:
  // Creates the channel and starts the stream thread; connecting happens in the background.
  // InvalidArgument when `config` is invalid.
  static absl::StatusOr<std::unique_ptr<KvEventSubscriber>> Start(KvEventSubscriberConfig config);

  KvEventSubscriber(const KvEventSubscriber&) = delete;
  KvEventSubscriber& operator=(const KvEventSubscriber&) = delete;
  // Stop().
  ~KvEventSubscriber();

  // Cancels the stream and joins the thread (waits for a callback in progress). Idempotent.
  // Not from the callbacks.
  void Stop();

  const std::string& address() const { return config_.address; }
  KvEventSubscriberStats Stats() const;

 private:
  // One Subscribe call: its reactor and what its callbacks report.
  class Call;
  // How one stream ended.
  struct StreamEnd {
    absl::Status status;
    bool delivered = false;  // a batch was received and accepted
    bool rejected = false;   // ended because the subscriber rejected a batch
  };

  explicit KvEventSubscriber(KvEventSubscriberConfig config);

  void Run();
  StreamEnd RunStream();
  // Checks `batch` against the position, passes it on, and advances. An error means
  // resubscribe from 0.
  absl::Status Process(const pdserve::internal::v1::KvEventBatch& batch);
  bool stopping() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_; }

  const KvEventSubscriberConfig config_;
  std::unique_ptr<pdserve::internal::v1::KvEventService::Stub> stub_;

  mutable absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  KvEventSubscriberStats stats_ ABSL_GUARDED_BY(mu_);

  // Position; only the stream thread touches these.
  bool synced_ = false;  // epoch_/last_sequence_ describe the applied state
  uint64_t epoch_ = 0;
  uint64_t last_sequence_ = 0;
  bool in_snapshot_ = false;  // a snapshot's first chunk was passed on, not its last
  uint64_t snapshot_epoch_ = 0;
  uint64_t snapshot_sequence_ = 0;

  absl::Mutex join_mu_;
  std::thread thread_ ABSL_GUARDED_BY(join_mu_);
};

}  // namespace pd::kv_events
