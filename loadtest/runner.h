// LoadRunner: sends a workload's requests to a pdserve.v1.Generation target and records what
// happened to each (see metrics.h for the record and the metric definitions).
//
// Requests are gRPC completion-queue async streams (grpc::ClientAsyncReader): any number of
// streams in flight are driven by `num_threads` polling threads (one CompletionQueue each; the
// thread that polls runs the handler, with no hand-off to an executor), and one issuer thread
// (the caller of Run) paces the arrivals. Every request sends token ids with max_tokens = the
// workload's output length and ignore_eos, so output lengths are as specified.
//
// Thread-safety: Run() is called once, from one thread; Stop() and Progress() may be called
// from any thread at any time. Stream events are handled on the runner's polling threads.
#pragma once

#include <grpcpp/channel.h>
#include <grpcpp/completion_queue.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "loadtest/arrival.h"
#include "loadtest/metrics.h"
#include "loadtest/progress.h"
#include "loadtest/workload.h"
#include "pd/v1/generation.grpc.pb.h"

namespace pd::loadtest {

struct RunnerOptions {
  std::string model;  // GenerateRequest.model; "" = the target's default
  ArrivalMode arrival = ArrivalMode::kClosed;
  // kClosed: requests kept in flight (>= 1). Open loop and trace: an upper bound on requests
  // in flight (an arrival waits for a free slot), 0 = none.
  int64_t concurrency = 1;
  double request_rate = 0;   // kPoisson / kGamma: mean arrivals per second (> 0)
  double burstiness = 1;     // kGamma: the Gamma shape (> 0)
  uint64_t seed = 0;         // of the arrival process
  int64_t num_requests = 0;  // stop issuing after this many requests; 0 = no bound
  // Stop issuing once this much time has passed since the start; requests in flight then run
  // to completion (each bounded by request_timeout). Zero = no bound.
  absl::Duration duration = absl::ZeroDuration();
  // gRPC deadline of each request; zero = none.
  absl::Duration request_timeout = absl::Minutes(10);
  bool ignore_eos = true;
  std::string cache_salt;  // GenerateRequest.cache_salt; "" = unset
  // Compare mode (a second group of channels): cache_salt of the copies sent there; "" = unset.
  std::string compare_cache_salt;
  int num_threads = 2;  // completion-queue polling threads, [1, 64]

  // InvalidArgument naming the offending field.
  absl::Status Validate() const;
};

struct RunResult {
  std::vector<RequestRecord> records;  // one per sent request, in workload order (then target)
  int64_t duration_ns = 0;             // first send -> last completion
  int64_t max_in_flight = 0;           // most requests in flight at once
  bool stopped = false;                // Stop() was called before the run ended
};

class LoadRunner {
 public:
  // `channels` (at least one) connect to the target; requests go round-robin over them (each
  // channel is one HTTP/2 connection). InvalidArgument for invalid options.
  //
  // Compare mode: when `compare_channels` is not empty, every request of the workload is sent
  // twice, to the target and to the compare target (over compare_channels), at the same
  // moment, one right after the other, the order alternating from request to request so that
  // neither target is always first. Records say which target (RequestRecord::target).
  // num_requests and the arrival process count workload requests (pairs); in a closed loop
  // `concurrency` is per target (pairs are started when two slots are free).
  static absl::StatusOr<std::unique_ptr<LoadRunner>> Create(
      RunnerOptions options, std::vector<std::shared_ptr<grpc::Channel>> channels,
      std::vector<std::shared_ptr<grpc::Channel>> compare_channels = {});
  // Waits for requests still in flight (there are none after Run returns), then stops the
  // polling threads.
  ~LoadRunner();
  LoadRunner(const LoadRunner&) = delete;
  LoadRunner& operator=(const LoadRunner&) = delete;

  // Sends the workload's requests until it is exhausted, a bound is reached or Stop() is
  // called, then waits for the requests in flight. Call once.
  RunResult Run(Workload* workload);

  // Stops issuing requests and cancels those in flight (recorded as cancelled_by_client).
  // Idempotent; may precede Run (which then sends nothing).
  void Stop();

  ProgressSnapshot Progress() const;

 private:
  class Call;

  LoadRunner(RunnerOptions options, std::vector<std::shared_ptr<grpc::Channel>> channels,
             std::vector<std::shared_ptr<grpc::Channel>> compare_channels);
  // Body of a polling thread: handles the events of `cq` until it is shut down.
  void Poll(grpc::CompletionQueue* cq);
  int64_t NowNs() const;
  // Blocks until `offset_ns` after the start. False when stopped first.
  bool SleepUntil(int64_t offset_ns);
  // Blocks until `slots` more requests fit under the in-flight limit. False when stopped first
  // or the duration bound passed.
  bool WaitForSlots(int64_t slots);
  // Starts `spec` on `target` (0 = the target, 1 = the compare target), moving its prompt when
  // `move_prompt`. False when stopped.
  bool Launch(RequestSpec& spec, int64_t scheduled_ns, int target, bool move_prompt);
  int num_targets() const { return stubs_[1].empty() ? 1 : 2; }
  // Called by a Call when its stream ended.
  void Finished(Call* call, RequestRecord record);

  const RunnerOptions options_;
  std::vector<std::shared_ptr<grpc::Channel>> channels_;  // both targets'
  // Per target: [0] the target, [1] the compare target (empty outside compare mode).
  std::vector<std::unique_ptr<pdserve::v1::Generation::Stub>> stubs_[2];
  std::vector<std::unique_ptr<grpc::CompletionQueue>> cqs_;
  std::vector<std::thread> pollers_;  // one per cq
  size_t next_stub_[2] = {0, 0};      // issuer thread only
  size_t next_cq_ = 0;                // issuer thread only
  // Steady-clock time of the start, set by Run before the first send; 0 before. Release/acquire
  // so that gRPC and progress threads see it once set.
  std::atomic<int64_t> start_steady_ns_{0};
  std::atomic<int64_t> output_tokens_{0};  // relaxed: a progress counter only

  mutable absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  bool running_ ABSL_GUARDED_BY(mu_) = false;
  absl::flat_hash_set<Call*> in_flight_ ABSL_GUARDED_BY(mu_);
  std::vector<RequestRecord> records_ ABSL_GUARDED_BY(mu_);
  int64_t sent_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t completed_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t failed_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t max_in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t last_end_ns_ ABSL_GUARDED_BY(mu_) = 0;
  std::optional<int64_t> total_requests_ ABSL_GUARDED_BY(mu_);  // for the progress bar
};

}  // namespace pd::loadtest
