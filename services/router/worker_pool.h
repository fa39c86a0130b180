// WorkerPool: the router's registry of workers. Workers are configured by address
// (--decode_workers, --prefill_workers); a background thread per worker checks it every
// `health_interval` (GetInfo until it is verified, then GetLoad), so a dead worker leaves the
// pool within one interval plus one RPC timeout (a hung one, whose checks time out, after
// max_missed_checks of them), and a restarted one rejoins by itself.
//
// A worker is admitted only when its GetInfo matches the router's model fingerprint and block
// size and its role serves the list it was configured in; otherwise it stays out with the
// reason logged (and shown in Snapshot().last_error).
//
// Time: the pool reads "now" (for NoteActivity's window) from a Clock, the real one in
// production; tests build the pool with CreateForTest, which takes a FakeClock and starts no
// checker threads, and run each check themselves with CheckNowForTest. RPC deadlines are always
// on the real clock (gRPC's).
//
// Thread-safe.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/time/clock.h"
#include "pd/v1/worker.grpc.pb.h"
#include "services/base/grpc_security.h"

namespace pd::router {

struct WorkerPoolOptions {
  absl::Duration health_interval = absl::Milliseconds(500);
  absl::Duration rpc_timeout = absl::Seconds(1);
  // A verified worker whose GetLoad times out this many times in a row leaves the pool; fewer
  // timeouts (a worker too busy to answer in time) keep it in, with its last load. A timeout
  // does not count while the worker's streams delivered a message within the last
  // health_interval + rpc_timeout (NoteActivity): it is evidently alive, only saturated. Any
  // other failure (connection refused, UNAVAILABLE, a GetInfo that fails or does not match)
  // takes it out at once. >= 1.
  int max_missed_checks = 3;
  std::string model_fingerprint;  // workers must report this one
  uint32_t block_size = 16;       // and this block size
  // and this KV cache dtype (their layout's)
  pdserve::internal::v1::KvDtype kv_dtype = pdserve::internal::v1::KV_DTYPE_FP32;
  // TLS and cluster token of the channels to the workers; null = plaintext, no token.
  std::shared_ptr<const services::ClientSecurity> security;
};

struct WorkerSnapshot {
  int index = 0;
  std::string address;
  std::string worker_id;  // from GetInfo; empty until verified
  std::string node_name;
  bool can_decode = false;   // configured in --decode_workers (and serves DecodeService)
  bool can_prefill = false;  // configured in --prefill_workers
  bool healthy = false;
  pdserve::internal::v1::WorkerLoad load;
  int64_t inflight = 0;  // streams this router has open on it
  int64_t assigned_blocks = 0;  // prompt KV blocks of those streams (Placement::new_blocks)
  // `inflight` and `assigned_blocks` when `load` was requested: what this router had placed
  // that the report may already count. Placement corrects the (stale) report by the change
  // since, so a stream that ended after the report stops weighing on the worker at once.
  int64_t inflight_at_report = 0;
  int64_t assigned_blocks_at_report = 0;
  std::string last_error;
};

class WorkerPool {
 public:
  // Called when a worker becomes healthy (after verification; on the pool's thread) or stops
  // being healthy (on the pool's thread, or on the thread calling MarkFailed).
  using HealthCallback = std::function<void(const WorkerSnapshot& worker)>;

  // Addresses may repeat across the lists (a `both` worker). InvalidArgument for an empty
  // list of decode workers or an empty address.
  static absl::StatusOr<std::unique_ptr<WorkerPool>> Create(
      const std::vector<std::string>& decode_addresses,
      const std::vector<std::string>& prefill_addresses, WorkerPoolOptions options,
      HealthCallback on_health_change = nullptr);
  // Tests: as Create, but reads time from `clock` (not owned; outlives the pool) and starts no
  // checker threads: nothing is checked until the test calls CheckNowForTest.
  static absl::StatusOr<std::unique_ptr<WorkerPool>> CreateForTest(
      const std::vector<std::string>& decode_addresses,
      const std::vector<std::string>& prefill_addresses, WorkerPoolOptions options,
      HealthCallback on_health_change, Clock* clock);
  ~WorkerPool();

  std::vector<WorkerSnapshot> Snapshot() const;
  int size() const { return static_cast<int>(workers_.size()); }

  pdserve::internal::v1::DecodeService::Stub* decode_stub(int index);

  // A call to the worker failed with UNAVAILABLE: out of the pool until it answers again.
  void MarkFailed(int index, const absl::Status& why);
  // A stream opened (delta 1) or closed (-1) on the worker, with `blocks` new KV blocks.
  void AddInflight(int index, int64_t delta, int64_t blocks = 0);
  // A stream on the worker delivered a message: evidence that it is alive (see
  // max_missed_checks). Cheap (a clock read and a relaxed atomic store); call on every message.
  void NoteActivity(int index);

  // Blocks until at least one decode-capable worker is healthy or `timeout` passes.
  bool WaitForDecodeWorker(absl::Duration timeout) const;

  // Runs one health check of worker `index` on the calling thread, as its checker thread does
  // every health_interval (GetInfo until verified, then GetLoad; the health callback runs on
  // this thread). For CreateForTest pools.
  void CheckNowForTest(int index);

 private:
  struct Worker;
  explicit WorkerPool(Clock* clock);
  // Everything of Create but the checker threads.
  static absl::StatusOr<std::unique_ptr<WorkerPool>> Build(
      const std::vector<std::string>& decode_addresses,
      const std::vector<std::string>& prefill_addresses, WorkerPoolOptions options,
      HealthCallback on_health_change, Clock* clock);
  void Run(Worker& w);
  void Check(Worker& w);
  void SetHealthy(Worker& w, bool healthy, const std::string& error);

  Clock* const clock_;
  WorkerPoolOptions options_;
  HealthCallback on_health_change_;
  std::vector<std::unique_ptr<Worker>> workers_;  // fixed after Create
  mutable absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;  // one health checker per worker
};

}  // namespace pd::router
