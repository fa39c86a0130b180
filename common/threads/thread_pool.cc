#include "common/threads/thread_pool.h"

#include <pthread.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/log/log.h"

namespace pd {

ThreadPool::ThreadPool(size_t num_threads, std::string name) {
  CHECK_GT(num_threads, 0u) << "thread pool " << name << " needs at least one thread";
  threads_.reserve(num_threads);
  for (size_t i = 0; i < num_threads; ++i) {
    threads_.emplace_back([this] { WorkLoop(); });
    std::string thread_name = absl::StrCat(name, "-", i).substr(0, 15);
    pthread_setname_np(threads_.back().native_handle(), thread_name.c_str());
  }
}

ThreadPool::~ThreadPool() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  for (std::thread& t : threads_) {
    t.join();
  }
}

absl::Status ThreadPool::Schedule(std::function<void()> fn) {
  absl::MutexLock lock(&mu_);
  if (stopping_) {
    return absl::FailedPreconditionError("thread pool is shutting down");
  }
  queue_.push_back(std::move(fn));
  return absl::OkStatus();
}

size_t ThreadPool::QueueSize() const {
  absl::MutexLock lock(&mu_);
  return queue_.size();
}

void ThreadPool::WorkLoop() {
  while (true) {
    std::function<void()> fn;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return !queue_.empty() || stopping_;
      };
      mu_.Await(absl::Condition(&ready));
      if (queue_.empty()) {
        return;  // stopping and drained
      }
      fn = std::move(queue_.front());
      queue_.pop_front();
    }
    fn();
  }
}

}  // namespace pd
