// ThreadPool: a fixed set of worker threads running queued closures in FIFO order.
//
// Thread-safe: Schedule may be called from any thread, including pool threads. The destructor
// stops accepting work, runs everything already queued, then joins (nothing scheduled is
// silently dropped).
#pragma once

#include <cstddef>
#include <deque>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"

namespace pd {

class ThreadPool {
 public:
  // Starts `num_threads` (> 0) threads. `name` prefixes the thread names seen in top/gdb
  // (truncated to 15 bytes by the kernel).
  ThreadPool(size_t num_threads, std::string name = "pd-pool");
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  // Queues `fn`. FailedPrecondition once shutdown has begun (the closure is not run).
  absl::Status Schedule(std::function<void()> fn);

  // Closures queued but not yet started.
  size_t QueueSize() const;
  size_t num_threads() const { return threads_.size(); }

 private:
  void WorkLoop();

  mutable absl::Mutex mu_;
  std::deque<std::function<void()>> queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

}  // namespace pd
