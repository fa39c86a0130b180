// KvEventPublisher: a worker's KV events, from its block pool to the routers
// (proto/pd/v1/kv_events.proto; docs/architecture.md, "KV events").
//
// It is the pool's KvEventListener (ModelRuntimeConfig::kv_listener): each change is numbered
// and kept in a bounded history, and the held set (hash -> parent) is updated, in a few
// microseconds on the scheduler thread. It is also the gRPC KvEventService: each Subscribe
// stream starts with a replay of the events after the subscriber's (epoch, from_sequence) when
// the history still has them, otherwise with a snapshot of the held set (chunks below ~1 MiB,
// the last one `complete`) taken together with its sequence number, then streams every new
// event in order, coalesced into batches of up to max_batch_events, with one write in flight
// per stream; an idle stream gets an empty batch (heartbeat) every heartbeat_interval, and one
// right after a replay start with nothing to replay, so that the subscriber knows it is live.
//
// Status codes ending a stream (besides the subscriber cancelling it):
//  - ABORTED: the subscriber fell so far behind that its next event left the history; it must
//    resubscribe (and then gets a HISTORY_TRUNCATED snapshot). Events are never skipped.
//  - UNAVAILABLE: the publisher is shutting down (Shutdown), or its worker id is not set yet.
//
// The epoch is random and non-zero per instance, so a restarted worker's numbering is never
// mistaken for the old one. Every block is reported in TIER_HBM (the worker's own pool).
//
// Lifetime: register it on a grpc::Server like any service; it must outlive that server and
// the model runtime it listens to. Call Shutdown() before shutting the server down, otherwise
// Server::Shutdown waits its whole deadline for the endless streams.
//
// Thread-safety: thread-safe. Listener callbacks may come from any one thread at a time (the
// scheduler thread); stream callbacks run on gRPC threads; heartbeats and new-event wake-ups
// are written by one internal thread.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/hash/block_hash.h"
#include "engine/kvcache/kv_event_listener.h"
#include "pd/v1/kv_events.grpc.pb.h"
#include "services/base/auth.h"
#include "services/kv_events/kv_event_log.h"

namespace pd::kv_events {

struct KvEventPublisherConfig {
  // Id of the publishing worker, stamped on every batch and event. May be empty at Create when
  // the id is only known once the gRPC port is bound: then call SetWorkerId before subscribers
  // can be served (until then Subscribe ends with UNAVAILABLE).
  std::string worker_id;
  // Events kept for replay to resubscribing subscribers; > 0.
  int64_t history_events = 100'000;
  // Bound on the history's estimated bytes; > 0 (KvEventLogConfig::history_bytes).
  int64_t history_bytes = 64 << 20;
  // Most events in one batch; > 0. Batches also stop growing at ~1 MiB.
  int max_batch_events = 512;
  // Empty batch on an idle stream this often; > 0.
  absl::Duration heartbeat_interval = absl::Seconds(1);
  // Tokens per block, for BlockStored.num_tokens; >= 0, 0 = unknown.
  int64_t block_size = 0;
  // Subscribe calls without the cluster token end with UNAUTHENTICATED; disabled = no check.
  services::ClusterTokenVerifier cluster_auth;

  // InvalidArgument naming the field.
  absl::Status Validate() const;
};

// Counters since Create, and current gauges; plain values.
struct KvEventPublisherStats {
  uint64_t epoch = 0;
  uint64_t last_sequence = 0;    // sequence of the newest event; 0 before any
  int64_t events_published = 0;  // events appended (== last_sequence)
  int64_t held_blocks = 0;       // blocks in the held set now
  int64_t history_events = 0;    // events kept for replay now
  int64_t subscribers = 0;       // open Subscribe streams now
  int64_t subscriptions = 0;     // Subscribe streams accepted
  int64_t replays = 0;           // streams that started with a replay
  int64_t snapshots_sent = 0;    // streams that started with a snapshot (not chunks)
  int64_t snapshot_chunks_sent = 0;
  int64_t batches_sent = 0;  // messages written, snapshot chunks and heartbeats included
  int64_t heartbeats_sent = 0;
  int64_t streams_fell_behind = 0;  // streams ended with ABORTED
};

class KvEventPublisher final : public kvcache::KvEventListener,
                               public pdserve::internal::v1::KvEventService::CallbackService {
 public:
  // Draws the epoch and starts the heartbeat thread. InvalidArgument when `config` is invalid.
  static absl::StatusOr<std::unique_ptr<KvEventPublisher>> Create(KvEventPublisherConfig config);

  KvEventPublisher(const KvEventPublisher&) = delete;
  KvEventPublisher& operator=(const KvEventPublisher&) = delete;
  // Shutdown(), then waits until every stream is done (the server must be shut down, or must
  // not be serving this publisher any more).
  ~KvEventPublisher() override;

  // Sets the worker id stamped on batches from now on. Thread-safe.
  void SetWorkerId(absl::string_view worker_id);

  // kvcache::KvEventListener, on the scheduler thread: record the change and wake idle streams.
  void OnBlocksStored(absl::Span<const BlockHash> hashes, std::optional<BlockHash> parent) override;
  void OnBlocksRemoved(absl::Span<const BlockHash> hashes) override;
  void OnAllCleared() override;

  // KvEventService.Subscribe (gRPC callback thread). UNAUTHENTICATED without the cluster token
  // when config.cluster_auth is enabled.
  grpc::ServerWriteReactor<pdserve::internal::v1::KvEventBatch>* Subscribe(
      grpc::CallbackServerContext* context,
      const pdserve::internal::v1::SubscribeRequest* request) override;

  // Ends every open stream with UNAVAILABLE (a stream with a write in flight ends as soon as
  // that write completes) and refuses new ones with UNAVAILABLE; stops the heartbeat thread.
  // The listener keeps recording. Idempotent; returns without waiting for the streams.
  void Shutdown();

  uint64_t epoch() const { return epoch_; }
  KvEventPublisherStats Stats() const;

  // The held set (hash -> parent), as a snapshot would carry it. For tests and debugging:
  // copies the whole set.
  std::vector<HeldBlock> HeldBlocksForTest() const;
  // While paused, streams start no writes (tests use it to let a stream fall behind the
  // history deterministically). Unpausing resumes every stream.
  void PauseWritesForTest(bool paused);

 private:
  class Stream;

  KvEventPublisher(KvEventPublisherConfig config, uint64_t epoch);

  // Starts the next write of `stream` if it is idle and has something to send (snapshot chunk,
  // events, or a due heartbeat), or finishes it when it must end. `now` decides heartbeats.
  void MaybeWriteLocked(Stream* stream, absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FinishLocked(Stream* stream, absl::Status status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Called by the listener callbacks after recording `n` events.
  void NotifyLocked(int n) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The heartbeat thread: wakes idle streams on new events and writes heartbeats.
  void PumpLoop();
  bool PumpShouldWake() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Stream callbacks (gRPC threads).
  void OnStreamWriteDone(Stream* stream, bool ok);
  void OnStreamCancel(Stream* stream);
  void OnStreamDone(Stream* stream);

  const KvEventPublisherConfig config_;
  const uint64_t epoch_;
  mutable absl::Mutex mu_;
  std::string worker_id_ ABSL_GUARDED_BY(mu_);
  KvEventLog log_ ABSL_GUARDED_BY(mu_);
  // Every stream from Subscribe until its OnDone.
  absl::flat_hash_set<Stream*> streams_ ABSL_GUARDED_BY(mu_);
  bool shutting_down_ ABSL_GUARDED_BY(mu_) = false;
  bool paused_ ABSL_GUARDED_BY(mu_) = false;
  // Events were recorded since the heartbeat thread last looked at the streams.
  bool wake_pump_ ABSL_GUARDED_BY(mu_) = false;
  bool stop_pump_ ABSL_GUARDED_BY(mu_) = false;
  KvEventPublisherStats stats_ ABSL_GUARDED_BY(mu_);
  std::thread pump_;
};

}  // namespace pd::kv_events
