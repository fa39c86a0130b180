// PrefillJob: the prefill side of a disaggregated prefill, without gRPC. One job per
// PrefillService.Prefill request:
//
//   Run: validate (layout, transport, block counts, sampling) -> connect to the decode
//        worker's transport -> submit the prompt (restoring tier blocks first, tier_restore.h)
//   engine on_prefilled: the prompt is computed and its blocks held -> KvHandoff::Send of the
//        blocks the decode worker asked for into its target blocks
//   handoff completion: release the held blocks -> `done` with the first token and timings
//
// PrefillServiceImpl adapts a gRPC call to Run; an in-process test calls Run directly.
//
// Thread-safety: Run may be called from any thread that may block (not an engine loop
// thread); the job's later steps run on the engine loop and the handoff threads.
#pragma once

#include <atomic>
#include <memory>

#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/base/strong_id.h"
#include "engine/scheduler/request.h"
#include "pd/v1/worker.pb.h"
#include "services/worker/worker_context.h"

namespace pd::worker {

class PrefillJob {
 public:
  // The job's outcome: OK with the response (first token, cached tokens, timings), or why it
  // failed.
  using Done = absl::AnyInvocable<void(const absl::Status& status,
                                       pdserve::internal::v1::PrefillResponse response)>;

  // Runs one prefill for a decode worker. `done` runs exactly once: on the calling thread when
  // the request is refused before it reaches the engine (InvalidArgument or
  // FailedPrecondition naming the bad field, a layout or transport mismatch, the engine's
  // admission error, Unavailable when the decode worker's transport cannot be reached), else
  // on the engine loop thread (the prompt failed, e.g. DeadlineExceeded or Cancelled) or the
  // handoff's thread (the transfer finished or failed). Blocks while connecting to a new
  // decode endpoint and while the engine admits the request. `ctx` must outlive the job.
  static void Run(WorkerContext* ctx, pdserve::internal::v1::PrefillRequest request,
                  absl::Time deadline, Done done);

  // The checks Run makes before anything is submitted (exposed for tests).
  static absl::Status Validate(const WorkerContext& ctx,
                               const pdserve::internal::v1::PrefillRequest& request);

 private:
  PrefillJob(WorkerContext* ctx, pdserve::internal::v1::PrefillRequest request, absl::Time deadline,
             Done done);

  // Engine loop thread: sends the prompt's blocks to the decode worker.
  void OnPrefilled(std::shared_ptr<PrefillJob> self, engine::PrefilledBlocks blocks);
  // Ends the job with `status` (once; later calls do nothing).
  void Finish(const absl::Status& status);
  // Lets the engine drop the held blocks (they stay as prefix-cache hits).
  void ReleaseBlocks();

  WorkerContext* const ctx_;
  const pd::RequestId id_;
  const pdserve::internal::v1::PrefillRequest request_;
  const absl::Time deadline_;
  Done done_;
  // Written by OnPrefilled and the transfer completion, which the handoff orders; read by
  // Finish after the last write.
  pdserve::internal::v1::PrefillResponse response_;
  std::atomic<bool> finished_{false};
};

}  // namespace pd::worker
