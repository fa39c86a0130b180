// LoadRunner: sends a workload's requests to a target and records what happened to each (see
// metrics.h for the record and the metric definitions).
//
// One issuer thread (the caller of Run) paces the arrivals; a RequestClient per protocol
// (request_client.h) sends the requests: pdserve.v1.Generation over gRPC async streams
// (grpc_client.h, `num_threads` polling threads) or the OpenAI HTTP API (openai_client.h).
// Every request asks for max_tokens = the workload's output length with ignore_eos, so output
// lengths are as specified.
//
// Thread-safety: Run() is called once, from one thread; Stop() and Progress() may be called
// from any thread at any time. Stream events are handled on the clients' threads.
#pragma once

#include <grpcpp/channel.h>
#include <grpcpp/completion_queue.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "loadtest/arrival.h"
#include "loadtest/metrics.h"
#include "loadtest/openai_client.h"
#include "loadtest/progress.h"
#include "loadtest/request_client.h"
#include "loadtest/sampling_penalties.h"
#include "loadtest/workload.h"

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
  double temperature = 0;  // sampling temperature (0 = greedy)
  SamplingPenalties penalties;  // zero = unset
  std::string cache_salt;  // GenerateRequest.cache_salt; "" = unset
  std::string json_schema;  // every request's output constraint (JSON Schema text); "" = none
  // Compare mode (a second group of channels): cache_salt of the copies sent there; "" = unset.
  std::string compare_cache_salt;
  int num_threads = 2;  // completion-queue polling threads, [1, 64]

  // InvalidArgument naming the offending field.
  absl::Status Validate() const;
};

// One target of a run and how to reach it.
struct RunnerTarget {
  Backend backend = Backend::kGrpc;
  // kGrpc: connections to the target (at least one); requests go round-robin over them.
  std::vector<std::shared_ptr<grpc::Channel>> channels;
  // kOpenAi: the client's settings; request_timeout, ignore_eos and temperature are taken from
  // RunnerOptions.
  OpenAiClientOptions openai;
  // kOpenAi: send cache_salt (an extension not every server accepts) only when this is set.
  bool openai_cache_salt = false;
};

struct RunResult {
  std::vector<RequestRecord> records;  // one per sent request, in workload order (then target)
  int64_t duration_ns = 0;             // first send -> last completion
  int64_t max_in_flight = 0;           // most requests in flight at once
  bool stopped = false;                // Stop() was called before the run ended
};

class LoadRunner : public RequestSink {
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
  // The same for targets of any backend; compare mode when `compare` is set. The two targets
  // may use different backends. InvalidArgument for invalid options or targets.
  static absl::StatusOr<std::unique_ptr<LoadRunner>> Create(RunnerOptions options,
                                                            RunnerTarget target,
                                                            std::optional<RunnerTarget> compare);
  // Waits for requests still in flight (there are none after Run returns), then stops the
  // polling threads.
  ~LoadRunner() override;
  LoadRunner(const LoadRunner&) = delete;
  LoadRunner& operator=(const LoadRunner&) = delete;

  // Sends the workload's requests until it is exhausted, a bound is reached or Stop() is
  // called, then waits for the requests in flight. Call once.
  RunResult Run(Workload* workload);

  // Stops issuing requests and cancels those in flight (recorded as cancelled_by_client).
  // Idempotent; may precede Run (which then sends nothing).
  void Stop();

  ProgressSnapshot Progress() const;

  // RequestSink: called by the clients when a request ended.
  void Finished(InFlight* request, RequestRecord record) override;

 private:
  explicit LoadRunner(RunnerOptions options);
  // Blocks until `offset_ns` after the start. False when stopped first.
  bool SleepUntil(int64_t offset_ns);
  // Blocks until `slots` more requests fit under the in-flight limit. False when stopped first
  // or the duration bound passed.
  bool WaitForSlots(int64_t slots);
  // Starts `spec` on `target` (0 = the target, 1 = the compare target), moving its prompt when
  // `move_prompt`. False when stopped.
  bool Launch(RequestSpec& spec, int64_t scheduled_ns, int target, bool move_prompt);
  int num_targets() const { return clients_[1] == nullptr ? 1 : 2; }

  const RunnerOptions options_;
  // The clients (one gRPC client serves both targets when both are gRPC), and per target
  // ([0] the target, [1] the compare target, null outside compare mode) the one it uses.
  std::vector<std::unique_ptr<RequestClient>> owned_clients_;
  RequestClient* clients_[2] = {nullptr, nullptr};
  bool send_salt_[2] = {true, true};  // whether the target gets cache_salt

  mutable absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  bool running_ ABSL_GUARDED_BY(mu_) = false;
  absl::flat_hash_set<InFlight*> in_flight_ ABSL_GUARDED_BY(mu_);
  std::vector<RequestRecord> records_ ABSL_GUARDED_BY(mu_);
  int64_t sent_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t completed_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t failed_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t max_in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t last_end_ns_ ABSL_GUARDED_BY(mu_) = 0;
  std::optional<int64_t> total_requests_ ABSL_GUARDED_BY(mu_);  // for the progress bar
};

}  // namespace pd::loadtest
