// ParallelFor: a persistent team of threads for short fork-join loops over an index range.
//
// Built for the model engine's CPU kernels: one decode step runs hundreds of parallel loops of a
// few microseconds each, so a call must cost far less than a queued std::function plus a
// condition-variable wake-up per worker. Run() publishes one job (a function pointer and a
// context pointer: no allocation), wakes the workers, runs chunk 0 on the calling thread and
// waits for the other chunks. After a job, idle workers spin for `spin` before blocking on a
// futex, so back-to-back calls (the layers of one forward pass) skip the wake-up syscalls.
// Chunking is static: with P participants, chunk c is [c*n/P, (c+1)*n/P), so a given (n, P)
// always splits the same way (kernels rely on that for reproducible reductions).
//
// Thread-safe: Run may be called from any thread; concurrent calls are serialized (one job at a
// time). A Run issued from inside a running job's fn (nested, same team) runs fn(0, n) serially
// on the calling thread instead of deadlocking. The destructor must not race with Run.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace pd {

class ParallelFor {
 public:
  struct Options {
    // Threads taking part in a job, the caller included: num_threads - 1 workers are started.
    // 1 makes Run serial on the caller. Must be >= 1.
    int num_threads = 1;
    // How long an idle worker spins (burning its core) after a job before it blocks. Longer
    // keeps back-to-back jobs cheap; shorter leaves the core to other processes sooner.
    absl::Duration spin = absl::Microseconds(100);
    // Prefix of the worker thread names (truncated to 15 bytes by the kernel).
    std::string name = "pd-par";
  };

  explicit ParallelFor(Options options);
  ~ParallelFor();
  ParallelFor(const ParallelFor&) = delete;
  ParallelFor& operator=(const ParallelFor&) = delete;

  // Calls fn(begin, end) over disjoint chunks covering [0, n), in parallel, and returns when all
  // chunks are done. Uses at most num_threads() chunks and at most ceil(n / min_chunk) of them,
  // so a chunk holds >= min_chunk items unless n itself is smaller. n <= 0 calls nothing.
  // fn must not throw; it runs on the caller and on worker threads.
  template <typename Fn>
  void Run(int64_t n, Fn&& fn, int64_t min_chunk = 1) {
    using F = std::remove_reference_t<Fn>;
    RunErased(
        n, min_chunk,
        [](void* ctx, int64_t begin, int64_t end) { (*static_cast<F*>(ctx))(begin, end); },
        const_cast<void*>(static_cast<const void*>(&fn)));
  }

  int num_threads() const { return num_threads_; }

 private:
  using ChunkFn = void (*)(void* ctx, int64_t begin, int64_t end);

  void RunErased(int64_t n, int64_t min_chunk, ChunkFn fn, void* ctx);
  void WorkerLoop(int worker_index);
  void WaitForWorkers();

  const int num_threads_;
  const int64_t spin_ns_;
  absl::Mutex run_mu_;  // serializes Run callers

  // The current job. Written by the caller (holding run_mu_) before the release store to
  // job_word_ that publishes it; read by participating workers after their acquire load.
  ChunkFn job_fn_ = nullptr;
  void* job_ctx_ = nullptr;
  int64_t job_n_ = 0;

  // (sequence << 8) | participants: a new value means a new job. Workers whose index is
  // >= participants - 1 skip the job without touching the fields above.
  alignas(64) std::atomic<uint64_t> job_word_{0};
  // Futex word workers sleep on; bumped after every job_word_ change.
  alignas(64) std::atomic<uint32_t> wake_seq_{0};
  std::atomic<int32_t> sleepers_{0};
  // Workers still running the current job; futex word the caller sleeps on when it waits long.
  alignas(64) std::atomic<int32_t> pending_{0};
  std::atomic<int32_t> caller_waiting_{0};
  std::atomic<bool> stopping_{false};

  std::vector<std::thread> workers_;
};

}  // namespace pd
