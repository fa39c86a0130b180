#include "engine/runtime/engine_loop.h"

#include <utility>

#include "absl/synchronization/notification.h"
#include "common/log/log.h"

namespace pd::engine {

EngineLoop::EngineLoop(Scheduler* scheduler, Options options)
    : scheduler_(scheduler), options_(options) {
  stats_ = scheduler_->Stats();
  thread_ = std::thread([this] { Run(); });
}

EngineLoop::~EngineLoop() { Stop(); }

absl::Status EngineLoop::Submit(GenerationRequest request) {
  absl::Status result;
  absl::Notification done;
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) {
      return absl::UnavailableError("engine is stopping");
    }
    commands_.push_back([&](Scheduler& s) {
      result = s.Submit(std::move(request));
      done.Notify();
    });
  }
  done.WaitForNotification();
  return result;
}

void EngineLoop::SubmitAsync(GenerationRequest request,
                             std::function<void(const absl::Status&)> rejected) {
  {
    absl::MutexLock lock(&mu_);
    if (!stopping_) {
      // A command queued before stopping_ is set runs before the loop cancels everything, so
      // the request gets its final output (kAbort at worst).
      commands_.push_back([request = std::make_shared<GenerationRequest>(std::move(request)),
                           rejected = std::move(rejected)](Scheduler& s) {
        if (absl::Status st = s.Submit(std::move(*request)); !st.ok()) {
          rejected(st);
        }
      });
      return;
    }
  }
  rejected(absl::UnavailableError("engine is stopping"));
}

void EngineLoop::Post(std::function<void(Scheduler&)> fn) {
  absl::MutexLock lock(&mu_);
  if (!stopped_) {
    commands_.push_back(std::move(fn));
  }
}

SchedulerStats EngineLoop::Stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

double EngineLoop::PrefillSecondsPerToken() const {
  absl::MutexLock lock(&mu_);
  return prefill_seconds_per_token_;
}

void EngineLoop::Run() {
  SchedulerStats last = scheduler_->Stats();
  bool cancelled_all = false;
  absl::Time stop_deadline = absl::InfiniteFuture();
  while (true) {
    std::vector<std::function<void(Scheduler&)>> commands;
    bool stopping = false;
    {
      absl::MutexLock lock(&mu_);
      commands.swap(commands_);
      stopping = stopping_;
      if (stopping && stop_deadline == absl::InfiniteFuture()) {
        stop_deadline = absl::Now() + stop_timeout_;
      }
    }
    for (auto& fn : commands) {
      fn(*scheduler_);
    }
    if (stopping && !cancelled_all) {
      scheduler_->CancelAll();
      cancelled_all = true;
    }
    const absl::Time step_start = absl::Now();
    const bool worked = scheduler_->Step();
    const absl::Duration step_time = absl::Now() - step_start;
    if (worked && options_.step_delay > absl::ZeroDuration()) {
      absl::SleepFor(options_.step_delay);
    }
    const SchedulerStats stats = scheduler_->Stats();
    const int64_t prefilled = stats.prefill_tokens - last.prefill_tokens;
    const int64_t decoded = stats.decode_tokens - last.decode_tokens;
    last = stats;
    if (prefilled >= 32 && prefilled >= 4 * decoded) {
      const double sample = absl::ToDoubleSeconds(step_time) / static_cast<double>(prefilled);
      absl::MutexLock lock(&mu_);
      prefill_seconds_per_token_ = prefill_seconds_per_token_ == 0
                                       ? sample
                                       : 0.8 * prefill_seconds_per_token_ + 0.2 * sample;
    }
    if (stopping && ((stats.waiting == 0 && stats.running == stats.remote_prefills) ||
                     absl::Now() >= stop_deadline)) {
      std::vector<std::function<void(Scheduler&)>> rest;
      {
        absl::MutexLock lock(&mu_);
        stats_ = stats;
        stopped_ = true;
        rest.swap(commands_);
      }
      // What was posted meanwhile still runs once (it may be a completion the scheduler is
      // waiting for); nothing is accepted from now on.
      for (auto& fn : rest) {
        fn(*scheduler_);
      }
      return;
    }
    absl::MutexLock lock(&mu_);
    stats_ = stats;
    if (worked || !commands_.empty()) {
      continue;
    }
    auto has_work = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return !commands_.empty() || (stopping_ && !stopped_);
    };
    if (scheduler_->idle()) {
      mu_.Await(absl::Condition(&has_work));
    } else {
      mu_.AwaitWithTimeout(absl::Condition(&has_work), options_.poll_interval);
    }
  }
}

void EngineLoop::Stop(absl::Duration timeout) {
  {
    absl::MutexLock lock(&mu_);
    if (!thread_.joinable()) {
      return;
    }
    if (!stopping_) {
      stopping_ = true;
      stop_timeout_ = timeout;
    }
  }
  thread_.join();
  VLOG(1) << "engine loop stopped";
}

}  // namespace pd::engine
