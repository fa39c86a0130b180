#include "common/threads/parallel_for.h"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "gtest/gtest.h"

namespace pd {
namespace {

ParallelFor::Options Opts(int threads, absl::Duration spin = absl::Microseconds(100)) {
  ParallelFor::Options o;
  o.num_threads = threads;
  o.spin = spin;
  o.name = "test";
  return o;
}

// Every index in [0, n) is visited exactly once, for thread counts above and below n.
TEST(ParallelForTest, CoversRangeExactlyOnce) {
  for (int threads : {1, 2, 3, 5}) {
    ParallelFor pf(Opts(threads));
    EXPECT_EQ(pf.num_threads(), threads);
    for (int64_t n : {0, 1, 2, 3, 7, 64, 1001}) {
      std::vector<std::atomic<int>> hits(n);
      pf.Run(n, [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) {
          hits[i].fetch_add(1);
        }
      });
      for (int64_t i = 0; i < n; ++i) {
        ASSERT_EQ(hits[i].load(), 1) << "threads " << threads << " n " << n << " i " << i;
      }
    }
  }
}

// Chunks are the documented static split [c*n/P, (c+1)*n/P), P limited by min_chunk.
TEST(ParallelForTest, StaticChunksAndMinChunk) {
  ParallelFor pf(Opts(3));
  std::mutex mu;
  std::vector<std::pair<int64_t, int64_t>> chunks;
  auto record = [&](int64_t b, int64_t e) {
    std::lock_guard<std::mutex> lock(mu);
    chunks.emplace_back(b, e);
  };
  pf.Run(10, record);
  std::sort(chunks.begin(), chunks.end());
  EXPECT_EQ(chunks, (std::vector<std::pair<int64_t, int64_t>>{{0, 3}, {3, 6}, {6, 10}}));
  chunks.clear();
  pf.Run(10, record, /*min_chunk=*/5);  // two chunks of 5
  std::sort(chunks.begin(), chunks.end());
  EXPECT_EQ(chunks, (std::vector<std::pair<int64_t, int64_t>>{{0, 5}, {5, 10}}));
  chunks.clear();
  pf.Run(10, record, /*min_chunk=*/100);  // one chunk, run by the caller
  EXPECT_EQ(chunks, (std::vector<std::pair<int64_t, int64_t>>{{0, 10}}));
}

TEST(ParallelForTest, CallerParticipates) {
  ParallelFor pf(Opts(2));
  const std::thread::id caller = std::this_thread::get_id();
  std::atomic<bool> caller_ran{false};
  pf.Run(2, [&](int64_t, int64_t) {
    if (std::this_thread::get_id() == caller) {
      caller_ran = true;
    }
  });
  EXPECT_TRUE(caller_ran.load());
}

// Many short back-to-back jobs; with spin 0 every wait goes through the futex path.
TEST(ParallelForTest, BackToBackJobsSpinAndSleep) {
  for (absl::Duration spin : {absl::Microseconds(200), absl::ZeroDuration()}) {
    ParallelFor pf(Opts(2, spin));
    std::vector<int64_t> out(300);
    int64_t total = 0;
    for (int iter = 0; iter < 500; ++iter) {
      pf.Run(static_cast<int64_t>(out.size()), [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) {
          out[i] = i + iter;
        }
      });
      total += out[iter % out.size()];
    }
    int64_t want = 0;
    for (int iter = 0; iter < 500; ++iter) {
      want += iter % 300 + iter;
    }
    EXPECT_EQ(total, want);
  }
}

TEST(ParallelForTest, NestedRunIsSerialOnTheCaller) {
  ParallelFor pf(Opts(2));
  std::atomic<int64_t> sum{0};
  pf.Run(4, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const std::thread::id outer = std::this_thread::get_id();
      pf.Run(10, [&](int64_t ib, int64_t ie) {
        EXPECT_EQ(std::this_thread::get_id(), outer);
        EXPECT_EQ(ib, 0);
        EXPECT_EQ(ie, 10);
        sum += ie - ib;
      });
    }
  });
  EXPECT_EQ(sum.load(), 40);
}

TEST(ParallelForTest, ConcurrentCallersAreSerialized) {
  ParallelFor pf(Opts(2));
  std::atomic<int64_t> sum{0};
  std::vector<std::thread> callers;
  for (int t = 0; t < 3; ++t) {
    callers.emplace_back([&] {
      for (int iter = 0; iter < 200; ++iter) {
        pf.Run(100, [&](int64_t b, int64_t e) { sum += e - b; });
      }
    });
  }
  for (std::thread& t : callers) {
    t.join();
  }
  EXPECT_EQ(sum.load(), 3 * 200 * 100);
}

TEST(ParallelForTest, DestroyWhileWorkersSleep) {
  for (int i = 0; i < 20; ++i) {
    ParallelFor pf(Opts(4, absl::ZeroDuration()));
    if (i % 2 == 0) {
      pf.Run(8, [](int64_t, int64_t) {});
    }
  }
}

}  // namespace
}  // namespace pd
