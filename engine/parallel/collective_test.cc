#include "engine/parallel/collective.h"

#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pd::engine {
namespace {

// Runs fn(rank) on `size` threads at once.
template <typename Fn>
void OnRanks(int size, Fn fn) {
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) threads.emplace_back([&fn, r] { fn(r); });
  for (std::thread& t : threads) t.join();
}

// Values whose sum depends on the order of the additions.
float Value(int rank, int64_t i) {
  return (rank % 2 == 0 ? 1.0f : -1.0f) * (1.0f + static_cast<float>(i % 7) * 1e-7f) *
         static_cast<float>(1 << (rank * 9 % 24));
}

TEST(ShmCollectiveTest, AllReduceAddsInRankOrderOnEveryRank) {
  for (int size : {1, 2, 3, 4}) {
    // Capacity 5: a reduction of 37 floats goes in 8 pieces.
    for (int64_t capacity : {int64_t{5}, int64_t{1024}}) {
      ShmCollectiveGroup group(size, capacity);
      constexpr int64_t kN = 37;
      std::vector<std::vector<float>> data(static_cast<size_t>(size));
      std::vector<absl::Status> status(static_cast<size_t>(size));
      OnRanks(size, [&](int r) {
        std::vector<float>& d = data[static_cast<size_t>(r)];
        for (int round = 0; round < 3; ++round) {  // the group is reused
          d.resize(kN);
          for (int64_t i = 0; i < kN; ++i) d[static_cast<size_t>(i)] = Value(r, i + round);
          status[static_cast<size_t>(r)].Update(group.rank(r)->AllReduceSum(d.data(), kN));
        }
      });
      for (int r = 0; r < size; ++r) {
        ASSERT_TRUE(status[static_cast<size_t>(r)].ok()) << status[static_cast<size_t>(r)];
        for (int64_t i = 0; i < kN; ++i) {
          float want = Value(0, i + 2);
          for (int q = 1; q < size; ++q) want += Value(q, i + 2);
          ASSERT_EQ(data[static_cast<size_t>(r)][static_cast<size_t>(i)], want)
              << "size " << size << " capacity " << capacity << " rank " << r << " i " << i;
        }
      }
    }
  }
}

TEST(ShmCollectiveTest, AllGatherColumnsPlacesEveryRanksBlock) {
  constexpr int kSize = 3;
  constexpr int64_t kRows = 4;
  const int64_t cols[kSize] = {3, 5, 2};
  const int64_t begin[kSize] = {0, 3, 8};
  constexpr int64_t kStride = 11;  // one spare column stays untouched
  ShmCollectiveGroup group(kSize, 16);
  std::vector<std::vector<float>> out(kSize, std::vector<float>(kRows * kStride, -1.0f));
  OnRanks(kSize, [&](int r) {
    std::vector<float> local(static_cast<size_t>(kRows * cols[r]));
    for (int64_t row = 0; row < kRows; ++row) {
      for (int64_t c = 0; c < cols[r]; ++c) {
        local[static_cast<size_t>(row * cols[r] + c)] =
            static_cast<float>(row * 100 + begin[r] + c);
      }
    }
    ASSERT_TRUE(group.rank(r)
                    ->AllGatherColumns(local.data(), kRows, cols[r], begin[r],
                                       out[static_cast<size_t>(r)].data(), kStride)
                    .ok());
  });
  for (int r = 0; r < kSize; ++r) {
    for (int64_t row = 0; row < kRows; ++row) {
      for (int64_t c = 0; c < kStride; ++c) {
        const float want = c < 10 ? static_cast<float>(row * 100 + c) : -1.0f;
        EXPECT_EQ(out[static_cast<size_t>(r)][static_cast<size_t>(row * kStride + c)], want)
            << "rank " << r << " row " << row << " col " << c;
      }
    }
  }
}

TEST(ShmCollectiveTest, AbortReleasesRanksWaitingForAPeerThatLeft) {
  ShmCollectiveGroup group(3, 8);
  std::vector<absl::Status> status(3);
  OnRanks(3, [&](int r) {
    if (r == 2) {  // fails before its collective, as a rank whose step errs
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      group.rank(r)->Abort();
      return;
    }
    float x[4] = {1, 2, 3, 4};
    status[static_cast<size_t>(r)] = group.rank(r)->AllReduceSum(x, 4);
  });
  EXPECT_EQ(status[0].code(), absl::StatusCode::kAborted) << status[0];
  EXPECT_EQ(status[1].code(), absl::StatusCode::kAborted) << status[1];
  // Ranks 0 and 1 waited about 20 ms for rank 2 (counted until the abort released them).
  EXPECT_GE(group.rank(0)->WaitNanos(), 10'000'000);
  EXPECT_GE(group.rank(1)->WaitNanos(), 10'000'000);
  EXPECT_EQ(group.rank(2)->WaitNanos(), 0);
  EXPECT_TRUE(group.aborted());
  // A later collective fails at once until Reset; after it the group works again.
  float y = 1;
  EXPECT_EQ(group.rank(0)->Barrier().code(), absl::StatusCode::kAborted);
  group.Reset();
  EXPECT_FALSE(group.aborted());
  OnRanks(3, [&](int r) {
    float v = static_cast<float>(r + 1);
    status[static_cast<size_t>(r)] = group.rank(r)->AllReduceSum(&v, 1);
    if (r == 0) y = v;
  });
  for (const absl::Status& s : status) EXPECT_TRUE(s.ok()) << s;
  EXPECT_EQ(y, 6.0f);
}

}  // namespace
}  // namespace pd::engine
