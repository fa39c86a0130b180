// RemotePrefill: the decode side of one disaggregated prefill (docs/architecture.md, "The
// worker's request path"). When the engine admits a request whose prompt a prefill worker
// should compute, it hands over the destination blocks (engine::RemotePrefillTarget); this
// class then
//
//   kExpecting          announces the blocks to the transport (KvHandoff::Expect)
//   kCalling            asks the prefill worker to fill them (PrefillPeer::Prefill); the
//                       transfer may finish before the answer arrives
//   kAwaitingTransfer   the peer answered OK with the first token; the bytes are not all in yet
//   kDone               CompleteRemotePrefill posted to the engine: the request decodes
//   kFailed             FailRemotePrefill posted: the request prefills locally into the same
//                       blocks (the expectation was cancelled first, so no late write lands)
//
// Exactly one of CompleteRemotePrefill or FailRemotePrefill is posted per request. A peer
// error, a failed transfer, or the deadline passing (the expectation's completion reports it,
// even when the peer never answers) fails it; a later answer is ignored.
//
// Thread-safety: thread-safe. Start runs on the engine loop thread; the peer's answer on the
// peer's thread; the transfer completion on the handoff's thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/base/strong_id.h"
#include "engine/scheduler/request.h"
#include "pd/v1/worker.pb.h"
#include "services/worker/prefill_peer.h"
#include "services/worker/worker_context.h"
#include "transport/kv_transport.h"

namespace pd::worker {

// What a remote prefill learns that the request's final response reports. Shared by the decode
// stream and the RemotePrefill, which may outlive each other.
struct RemotePrefillStats {
  std::atomic<uint64_t> kv_transfer_us{0};
  std::atomic<uint32_t> prefill_cached_tokens{0};
  std::atomic<uint32_t> prefill_tier_cached_tokens{0};
  std::atomic<uint64_t> kv_restore_us{0};
};

class RemotePrefill {
 public:
  enum class State : uint8_t { kExpecting, kCalling, kAwaitingTransfer, kDone, kFailed };

  // Makes `request`'s prompt prefilled by `peer` (sets request->remote_prefill): once the
  // engine admits it, a RemotePrefill starts for the request's target blocks. `decode` is the
  // decode request (prompt, sampling, cache salt, request id for logs); `deadline` bounds the
  // call and the transfer. `ctx` and `peer` must outlive the request.
  static void Attach(WorkerContext* ctx, PrefillPeer* peer,
                     std::shared_ptr<const pdserve::internal::v1::DecodeRequest> decode,
                     absl::Time deadline, std::shared_ptr<RemotePrefillStats> stats,
                     engine::GenerationRequest* request);

  // Engine loop thread: runs the hand-off for `target` (what Attach's callback does).
  static void Start(WorkerContext* ctx, PrefillPeer* peer,
                    std::shared_ptr<const pdserve::internal::v1::DecodeRequest> decode,
                    engine::RemotePrefillTarget target, absl::Time deadline,
                    std::shared_ptr<RemotePrefillStats> stats);

  // RemotePrefill objects alive in this process (tests check that none leaks).
  static int64_t LiveForTest();

  ~RemotePrefill();
  RemotePrefill(const RemotePrefill&) = delete;
  RemotePrefill& operator=(const RemotePrefill&) = delete;

 private:
  RemotePrefill(WorkerContext* ctx,
                std::shared_ptr<const pdserve::internal::v1::DecodeRequest> decode,
                pd::RequestId id, absl::Time deadline, std::shared_ptr<RemotePrefillStats> stats);

  // The prefill request for `target`, naming the announced blocks' descriptor and tag.
  // `wire_blocks`: the blocks the prefill worker writes (KvHandoff::Expect's wire_dst).
  pdserve::internal::v1::PrefillRequest BuildRequest(const engine::RemotePrefillTarget& target,
                                                     absl::Span<const BlockId> wire_blocks,
                                                     const transport::Expectation& expectation,
                                                     uint64_t tag) const;
  // The peer's answer (any thread).
  void OnPeerAnswer(const absl::Status& status,
                    const pdserve::internal::v1::PrefillResponse& response);
  // The expectation finished, failed, or its deadline passed (the handoff's thread).
  void OnTransfer(const transport::TransferState& state);
  // Terminal steps, called once, outside mu_.
  void Complete(uint32_t first_token, std::optional<engine::TokenLogprob> first_logprob,
                int64_t kept_tokens, uint64_t bytes);
  void Fail(const absl::Status& why, bool cancel_expectation);

  WorkerContext* const ctx_;
  const std::shared_ptr<const pdserve::internal::v1::DecodeRequest> decode_;
  const pd::RequestId id_;
  const absl::Time deadline_;
  const std::shared_ptr<RemotePrefillStats> stats_;

  absl::Mutex mu_;
  State state_ ABSL_GUARDED_BY(mu_) = State::kExpecting;
  TransferId expectation_ ABSL_GUARDED_BY(mu_);
  bool transfer_done_ ABSL_GUARDED_BY(mu_) = false;  // the bytes are in (kCalling)
  uint64_t transfer_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  uint32_t first_token_ ABSL_GUARDED_BY(mu_) = 0;  // from the answer (kAwaitingTransfer)
  std::optional<engine::TokenLogprob> first_logprob_ ABSL_GUARDED_BY(mu_);  // idem, when asked
  int64_t kept_tokens_ ABSL_GUARDED_BY(mu_) = 0;  // idem: PrefillResponse.kv_kept_tokens
};

}  // namespace pd::worker
