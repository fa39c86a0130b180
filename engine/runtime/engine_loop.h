// EngineLoop: runs a Scheduler on its own thread and makes it usable from many threads (gRPC
// handlers, transfer completions).
//
// The scheduler is thread-compatible; the loop owns its thread. Other threads reach it in two
// ways: Submit (synchronous: returns the scheduler's admission verdict), SubmitAsync (the same
// verdict, reported to a callback when it is a refusal) and Post (asynchronous: `fn` runs on
// the loop thread before its next step). Request callbacks (on_output,
// remote_prefill, on_prefilled) run on the loop thread; they may call Post but never Submit.
//
// Idle cost: the thread sleeps while the scheduler is idle; while requests wait (for blocks,
// for a remote prefill) it wakes every `poll_interval` to check deadlines and cancellations.
#pragma once

#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "engine/scheduler/scheduler.h"

namespace pd::engine {

class EngineLoop {
 public:
  struct Options {
    absl::Duration poll_interval = absl::Milliseconds(2);
    // Sleep after every step that ran a batch: slows generation down on purpose (fault and
    // drain tests, demos on fast models). Zero in production.
    absl::Duration step_delay = absl::ZeroDuration();
  };

  // Starts the loop thread. `scheduler` must outlive the loop.
  EngineLoop(Scheduler* scheduler, Options options);
  explicit EngineLoop(Scheduler* scheduler) : EngineLoop(scheduler, Options{}) {}
  // Stop().
  ~EngineLoop();
  EngineLoop(const EngineLoop&) = delete;
  EngineLoop& operator=(const EngineLoop&) = delete;

  // Scheduler::Submit on the loop thread; blocks until it ran (at most one step). Unavailable
  // after Stop. Must not be called from a request callback (it would wait on itself).
  absl::Status Submit(GenerationRequest request);

  // Scheduler::Submit on the loop thread before its next step, without waiting for it: a thread
  // that serves many requests (the tier client's, a gRPC handler's) does not sit out a step per
  // request. When the scheduler refuses the request, or the loop is stopping, `rejected` runs
  // with the reason: on the loop thread, or on the calling thread when the loop is stopping.
  // Exactly one of the request's final output or `rejected` happens. Safe from any thread,
  // including request callbacks.
  void SubmitAsync(GenerationRequest request, std::function<void(const absl::Status&)> rejected);

  // Runs `fn` on the loop thread before the next step. Safe from any thread, including request
  // callbacks. Dropped (never run) after Stop.
  void Post(std::function<void(Scheduler&)> fn);

  // Snapshot of the scheduler's statistics, refreshed after every step.
  SchedulerStats Stats() const;

  // Measured cost of computing one prompt token, in seconds: a moving average (weight 0.2 per
  // sample) of the wall time of steps that were mostly prefill (at least 32 prompt tokens and
  // 4x more prompt than decode tokens), divided by their prompt tokens. 0 until such a step ran.
  // What a restore from another node is weighed against (tier_restore.cc, issue #19).
  double PrefillSecondsPerToken() const;

  // Cancels every request (each gets its final kAbort output), runs the scheduler until no
  // request is left running except those waiting for a remote prefill or holding prefilled
  // blocks (bounded by `timeout`), and joins the thread. Idempotent.
  void Stop(absl::Duration timeout = absl::Seconds(5));

 private:
  void Run();

  Scheduler* const scheduler_;
  const Options options_;
  mutable absl::Mutex mu_;
  std::vector<std::function<void(Scheduler&)>> commands_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  SchedulerStats stats_ ABSL_GUARDED_BY(mu_);
  double prefill_seconds_per_token_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Duration stop_timeout_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

}  // namespace pd::engine
