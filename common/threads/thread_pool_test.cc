#include "common/threads/thread_pool.h"

#include <atomic>
#include <memory>

#include "absl/synchronization/blocking_counter.h"
#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"

namespace pd {
namespace {

TEST(ThreadPoolTest, RunsEveryClosure) {
  ThreadPool pool(2, "test");
  EXPECT_EQ(pool.num_threads(), 2u);
  std::atomic<int> sum{0};
  absl::BlockingCounter done(100);
  for (int i = 1; i <= 100; ++i) {
    ASSERT_TRUE(pool.Schedule([&, i] {
                      sum += i;
                      done.DecrementCount();
                    })
                    .ok());
  }
  done.Wait();
  EXPECT_EQ(sum.load(), 5050);
}

TEST(ThreadPoolTest, DestructorDrainsQueuedWork) {
  std::atomic<int> ran{0};
  absl::Notification started, release;
  {
    ThreadPool pool(1);
    ASSERT_TRUE(pool.Schedule([&] {
                      started.Notify();
                      release.WaitForNotification();
                    })
                    .ok());
    started.WaitForNotification();
    for (int i = 0; i < 10; ++i) {
      ASSERT_TRUE(pool.Schedule([&] { ++ran; }).ok());
    }
    EXPECT_EQ(pool.QueueSize(), 10u);  // the only thread is blocked, so nothing else started
    release.Notify();
  }
  EXPECT_EQ(ran.load(), 10);
}

TEST(ThreadPoolTest, ScheduleFromAPoolThread) {
  ThreadPool pool(2);
  absl::Notification inner_ran;
  ASSERT_TRUE(pool.Schedule([&] { ASSERT_TRUE(pool.Schedule([&] { inner_ran.Notify(); }).ok()); })
                  .ok());
  inner_ran.WaitForNotification();
}

}  // namespace
}  // namespace pd
