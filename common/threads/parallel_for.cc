#include "common/threads/parallel_for.h"

#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <climits>

#include "absl/strings/str_cat.h"
#include "common/log/log.h"

namespace pd {
namespace {

// The team whose job this thread is running (caller or worker), to run nested calls serially.
thread_local const ParallelFor* tls_active_team = nullptr;

void FutexWait(std::atomic<uint32_t>* word, uint32_t expected) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT_PRIVATE, expected, nullptr,
          nullptr, 0);
}

void FutexWake(void* word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE_PRIVATE, INT_MAX, nullptr,
          nullptr, 0);
}

inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// Spinning past this hands the core over with sched_yield between checks, so a descheduled
// thread we wait for (more threads than free cores) gets to run instead of the spinner.
constexpr int64_t kPureSpinNs = 2000;

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

constexpr int kMaxThreads = 255;  // participants are packed into 8 bits of job_word_

}  // namespace

ParallelFor::ParallelFor(Options options)
    : num_threads_(options.num_threads),
      spin_ns_(absl::ToInt64Nanoseconds(std::max(options.spin, absl::ZeroDuration()))) {
  CHECK_GE(num_threads_, 1) << "ParallelFor needs at least one thread";
  CHECK_LE(num_threads_, kMaxThreads) << "ParallelFor supports at most " << kMaxThreads;
  workers_.reserve(num_threads_ - 1);
  for (int i = 0; i + 1 < num_threads_; ++i) {
    workers_.emplace_back([this, i] { WorkerLoop(i); });
    std::string thread_name = absl::StrCat(options.name, "-", i).substr(0, 15);
    pthread_setname_np(workers_.back().native_handle(), thread_name.c_str());
  }
}

ParallelFor::~ParallelFor() {
  stopping_.store(true);
  // A job word change wakes spinning workers; the futex bump wakes sleeping ones.
  job_word_.fetch_add(uint64_t{1} << 8);
  wake_seq_.fetch_add(1);
  FutexWake(&wake_seq_);
  for (std::thread& t : workers_) {
    t.join();
  }
}

void ParallelFor::RunErased(int64_t n, int64_t min_chunk, ChunkFn fn, void* ctx) {
  if (n <= 0) {
    return;
  }
  if (min_chunk < 1) {
    min_chunk = 1;
  }
  const int64_t max_parts = (n + min_chunk - 1) / min_chunk;
  const int parts = static_cast<int>(std::min<int64_t>(num_threads_, max_parts));
  if (parts <= 1 || tls_active_team == this) {
    fn(ctx, 0, n);
    return;
  }
  absl::MutexLock lock(&run_mu_);
  job_fn_ = fn;
  job_ctx_ = ctx;
  job_n_ = n;
  pending_.store(parts - 1, std::memory_order_relaxed);
  const uint64_t seq = (job_word_.load(std::memory_order_relaxed) >> 8) + 1;
  // Release: publishes job_fn_/job_ctx_/job_n_/pending_ to workers that acquire-load the word.
  job_word_.store((seq << 8) | static_cast<uint64_t>(parts), std::memory_order_release);
  // seq_cst pair with the sleepers_ increment + futex re-check in WorkerLoop: either we see the
  // sleeper and wake it, or it sees the new wake_seq_ and does not sleep.
  wake_seq_.fetch_add(1);
  if (sleepers_.load() > 0) {
    FutexWake(&wake_seq_);
  }

  tls_active_team = this;
  fn(ctx, 0, n / parts);
  tls_active_team = nullptr;
  WaitForWorkers();
}

void ParallelFor::WaitForWorkers() {
  // Acquire pairs with the workers' release decrement: their writes are visible after this.
  const int64_t start = NowNs();
  for (int i = 0; pending_.load(std::memory_order_acquire) != 0; ++i) {
    CpuRelax();
    if ((i & 63) != 63) {
      continue;
    }
    const int64_t elapsed = NowNs() - start;
    if (elapsed > kPureSpinNs) {
      sched_yield();
    }
    if (elapsed > spin_ns_) {
      // Dekker pair with the last worker (decrement, then load caller_waiting_).
      caller_waiting_.store(1);
      int32_t left;
      while ((left = pending_.load()) != 0) {
        FutexWait(reinterpret_cast<std::atomic<uint32_t>*>(&pending_), static_cast<uint32_t>(left));
      }
      caller_waiting_.store(0);
      return;
    }
  }
}

void ParallelFor::WorkerLoop(int worker_index) {
  uint64_t seen = 0;
  while (true) {
    // Wait for a new job word: spin first, then sleep on the futex.
    uint64_t word = job_word_.load(std::memory_order_acquire);
    if (word == seen) {
      int64_t start = NowNs();
      for (int i = 0; (word = job_word_.load(std::memory_order_acquire)) == seen; ++i) {
        CpuRelax();
        if ((i & 63) != 63) {
          continue;
        }
        const int64_t elapsed = NowNs() - start;
        if (elapsed > kPureSpinNs) {
          sched_yield();
        }
        if (elapsed > spin_ns_) {
          const uint32_t ticket = wake_seq_.load();
          sleepers_.fetch_add(1);
          if (job_word_.load() == seen && !stopping_.load()) {
            FutexWait(&wake_seq_, ticket);
          }
          sleepers_.fetch_sub(1);
          start = NowNs();
        }
      }
    }
    seen = word;
    if (stopping_.load(std::memory_order_acquire)) {
      return;
    }
    const int parts = static_cast<int>(word & 0xff);
    const int chunk = worker_index + 1;
    if (chunk >= parts) {
      continue;  // not a participant: the job fields may already belong to a later job
    }
    const int64_t n = job_n_;
    tls_active_team = this;
    job_fn_(job_ctx_, n * chunk / parts, n * (chunk + 1) / parts);
    tls_active_team = nullptr;
    // Releases the chunk's writes to the caller (its acquire load in WaitForWorkers); seq_cst
    // also orders it before the caller_waiting_ load (Dekker pair with WaitForWorkers).
    if (pending_.fetch_sub(1) == 1 && caller_waiting_.load() != 0) {
      FutexWake(&pending_);
    }
  }
}

}  // namespace pd
