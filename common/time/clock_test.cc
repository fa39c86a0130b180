#include "common/time/clock.h"

#include <thread>

#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"

namespace pd {
namespace {

TEST(ClockTest, RealClockMovesForward) {
  absl::Time a = Clock::Real()->Now();
  absl::Time b = Clock::Real()->Now();
  EXPECT_LE(a, b);
}

TEST(FakeClockTest, AdvanceAndSleep) {
  FakeClock clock;
  absl::Time start = clock.Now();
  clock.Advance(absl::Seconds(3));
  EXPECT_EQ(clock.Now() - start, absl::Seconds(3));

  absl::Notification woke;
  std::thread sleeper([&] {
    clock.SleepFor(absl::Seconds(10));
    woke.Notify();
  });
  clock.BlockUntilSleepersForTest(1);
  clock.Advance(absl::Seconds(4));
  EXPECT_FALSE(woke.WaitForNotificationWithTimeout(absl::Milliseconds(20)));
  clock.Advance(absl::Seconds(6));
  woke.WaitForNotification();
  sleeper.join();
}

}  // namespace
}  // namespace pd
