// NcclCollective with two ranks, one thread and one device each. Built twice: against the CPU
// fake of CUDA and NCCL (transport/nccl/fake_cuda_nccl.h; label unit, runs everywhere) and
// against CUDA and NCCL themselves (label gpu; skips below two GPUs).
#include "engine/parallel/nccl_collective.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <chrono>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pd::engine {
namespace {

using ::testing::HasSubstr;

// Runs fn(rank, collective) on two threads, each with its device, stream and communicator.
template <typename Fn>
void OnTwoRanks(const std::vector<std::pair<int64_t, int64_t>>& split, Fn fn) {
  ncclUniqueId id;
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      ASSERT_EQ(cudaSetDevice(r), cudaSuccess);
      cudaStream_t stream = nullptr;
      ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
      ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
      config.blocking = 0;
      ncclComm_t comm = nullptr;
      ncclResult_t init = ncclCommInitRankConfig(&comm, 2, id, r, &config);
      ASSERT_TRUE(init == ncclSuccess || init == ncclInProgress) << ncclGetErrorString(init);
      ncclResult_t state = ncclInProgress;
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
      while (state == ncclInProgress && std::chrono::steady_clock::now() < deadline) {
        ASSERT_EQ(ncclCommGetAsyncError(comm, &state), ncclSuccess);
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      ASSERT_EQ(state, ncclSuccess) << ncclGetErrorString(state);
      absl::StatusOr<std::unique_ptr<NcclCollective>> c =
          NcclCollective::Create(comm, stream, r, 2, split, 4);
      ASSERT_TRUE(c.ok()) << c.status();
      fn(r, **c, stream);
      c->reset();
      cudaStreamDestroy(stream);
    });
  }
  for (std::thread& t : threads) t.join();
}

bool TwoDevices() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n >= 2;
}

TEST(NcclCollectiveTest, AllReduceAndGatherColumnsAcrossTwoRanks) {
  if (!TwoDevices()) GTEST_SKIP() << "needs two CUDA devices";
  const std::vector<std::pair<int64_t, int64_t>> split = {{0, 3}, {3, 5}};  // uneven, as vocab
  std::vector<float> reduced[2], gathered[2];
  OnTwoRanks(split, [&](int r, NcclCollective& c, cudaStream_t stream) {
    constexpr int64_t kN = 1000;
    std::vector<float> host(kN);
    for (int64_t i = 0; i < kN; ++i) host[i] = static_cast<float>(i * (r + 1)) + 0.25f * r;
    void* d = nullptr;
    ASSERT_EQ(cudaMalloc(&d, kN * 4), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(d, host.data(), kN * 4, cudaMemcpyHostToDevice), cudaSuccess);
    ASSERT_TRUE(c.AllReduceSum(static_cast<float*>(d), kN).ok());
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    reduced[r].resize(kN);
    ASSERT_EQ(cudaMemcpy(reduced[r].data(), d, kN * 4, cudaMemcpyDeviceToHost), cudaSuccess);

    // 2 rows of this rank's columns into a [2][9] matrix (column 8 untouched).
    const int64_t cols = split[r].second, begin = split[r].first;
    std::vector<float> local(2 * cols), out(2 * 9, -1.0f);
    for (int64_t row = 0; row < 2; ++row) {
      for (int64_t j = 0; j < cols; ++j) local[row * cols + j] = row * 100 + begin + j;
    }
    void *dl = nullptr, *dout = nullptr;
    ASSERT_EQ(cudaMalloc(&dl, local.size() * 4), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&dout, out.size() * 4), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(dl, local.data(), local.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(dout, out.data(), out.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
    absl::Status s =
        c.AllGatherColumns(static_cast<float*>(dl), 2, cols, begin, static_cast<float*>(dout), 9);
    ASSERT_TRUE(s.ok()) << s;
    ASSERT_TRUE(c.Barrier().ok());
    gathered[r].resize(out.size());
    ASSERT_EQ(cudaMemcpy(gathered[r].data(), dout, out.size() * 4, cudaMemcpyDeviceToHost),
              cudaSuccess);
    // A block that is not this rank's split is refused before anything is enqueued.
    EXPECT_THAT(c.AllGatherColumns(static_cast<float*>(dl), 2, cols + 1, begin,
                                   static_cast<float*>(dout), 9)
                    .message(),
                HasSubstr("its split is"));
    cudaFree(d);
    cudaFree(dl);
    cudaFree(dout);
  });
  for (int r = 0; r < 2; ++r) {
    ASSERT_EQ(reduced[r].size(), 1000u);
    for (int64_t i = 0; i < 1000; ++i) {
      EXPECT_EQ(reduced[r][i], static_cast<float>(i) + (static_cast<float>(2 * i) + 0.25f));
    }
    for (int64_t row = 0; row < 2; ++row) {
      for (int64_t j = 0; j < 9; ++j) {
        EXPECT_EQ(gathered[r][row * 9 + j], j < 8 ? row * 100.0f + j : -1.0f)
            << "rank " << r << " row " << row << " col " << j;
      }
    }
  }
}

TEST(NcclCollectiveTest, BadArgumentsAndAbortAreNamed) {
  if (!TwoDevices()) GTEST_SKIP() << "needs two CUDA devices";
  int dummy = 0;
  EXPECT_THAT(NcclCollective::Create(&dummy, nullptr, 2, 2, {{0, 1}, {1, 1}}, 4).status().message(),
              HasSubstr("rank 2 of 2"));
  EXPECT_THAT(NcclCollective::Create(&dummy, nullptr, 0, 2, {{0, 1}, {1, 0}}, 4).status().message(),
              HasSubstr("are empty"));
  OnTwoRanks({{0, 1}, {1, 1}}, [](int, NcclCollective& c, cudaStream_t) {
    c.Abort();
    EXPECT_EQ(c.Barrier().code(), absl::StatusCode::kAborted);
    EXPECT_EQ(c.AllReduceSum(nullptr, 4).code(), absl::StatusCode::kAborted);
  });
}

}  // namespace
}  // namespace pd::engine
