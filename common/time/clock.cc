#include "common/time/clock.h"


namespace pd {
namespace {

class RealClock : public Clock {
 public:
  absl::Time Now() const override { return absl::Now(); }
  void SleepFor(absl::Duration d) override { absl::SleepFor(d); }
};

}  // namespace

Clock* Clock::Real() {
  static RealClock* clock = new RealClock();  // leaked on purpose: usable during exit
  return clock;
}

absl::Time FakeClock::Now() const {
  absl::MutexLock lock(&mu_);
  return now_;
}

void FakeClock::SleepFor(absl::Duration d) {
  absl::MutexLock lock(&mu_);
  const absl::Time until = now_ + d;
  auto reached = [this, until]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return now_ >= until; };
  ++sleepers_;
  mu_.Await(absl::Condition(&reached));
  --sleepers_;
}

void FakeClock::BlockUntilSleepersForTest(int n) {
  absl::MutexLock lock(&mu_);
  auto enough = [this, n]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return sleepers_ >= n; };
  mu_.Await(absl::Condition(&enough));
}

void FakeClock::Advance(absl::Duration d) {
  absl::MutexLock lock(&mu_);
  now_ += d;
}

}  // namespace pd
