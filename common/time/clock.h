// Clock: the one source of "now" for components that time out, expire or back off, so tests can
// drive time with FakeClock instead of sleeping.
#pragma once

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace pd {

// Thread-safe: implementations may be called from any thread.
class Clock {
 public:
  virtual ~Clock() = default;
  virtual absl::Time Now() const = 0;
  // Blocks the caller for `d` of this clock's time (FakeClock: until Advance passes it).
  virtual void SleepFor(absl::Duration d) = 0;

  // The process-wide real clock (absl::Now / absl::SleepFor). Never null, never destroyed.
  static Clock* Real();
};

// Manually advanced time for tests. Starts at the Unix epoch + 1e9 s unless given.
// Thread-safe.
class FakeClock : public Clock {
 public:
  explicit FakeClock(absl::Time start = absl::FromUnixSeconds(1'000'000'000)) : now_(start) {}

  absl::Time Now() const override;
  // Returns once another thread has advanced the clock by at least `d`.
  void SleepFor(absl::Duration d) override;
  void Advance(absl::Duration d);
  // Blocks until `n` threads are inside SleepFor, so a test can advance time after they sleep.
  void BlockUntilSleepersForTest(int n);

 private:
  mutable absl::Mutex mu_;
  absl::Time now_ ABSL_GUARDED_BY(mu_);
  int sleepers_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace pd
