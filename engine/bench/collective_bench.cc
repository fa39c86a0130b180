// The tensor-parallel all-reduce (engine/parallel/collective.h, ShmCollectiveGroup) against the
// memory-bandwidth ceiling measured in the same run.
//
//   BM_AllReduce/floats/threads   `threads` ranks (Google Benchmark threads, one per rank) each
//                                 all-reduce `floats` floats per iteration. algbw_GBps = 4 *
//                                 floats / time (NCCL's algorithm bandwidth); busbw_GBps =
//                                 algbw * 2 (N - 1) / N (NCCL's bus bandwidth: what each rank
//                                 moves, comparable across N). memcpy_GBps: one thread copying
//                                 the same 4 * floats bytes between two buffers just before the
//                                 timed loop (best of 5); ratio = busbw / memcpy.
//
// Sizes: 64 x 2048 floats is a 64-token step's residual stream of a 2048-wide model (the `1b`
// preset), 2048 floats one decode token's; 4 Mi floats a large prefill chunk.
//
// With more ranks than cores (4 on a 2-core VM) the ranks take turns on the cores: those rows
// measure the oversubscribed case, not the algorithm.
//
// Usage: collective_bench [benchmark flags]. Not run by ctest (timings on a shared VM).
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "benchmark/benchmark.h"
#include "engine/parallel/collective.h"

namespace pd::engine {
namespace {

double MemcpyGBps(int64_t bytes) {
  std::vector<char> a(static_cast<size_t>(bytes), 1), b(static_cast<size_t>(bytes), 0);
  double best = 0;
  for (int pass = 0; pass < 5; ++pass) {
    const int reps = static_cast<int>(std::max<int64_t>(1, (int64_t{256} << 20) / bytes));
    const auto t0 = std::chrono::steady_clock::now();
    for (int r = 0; r < reps; ++r) {
      std::memcpy(b.data(), a.data(), static_cast<size_t>(bytes));
      benchmark::DoNotOptimize(b.data());
      benchmark::ClobberMemory();
    }
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::max(best, static_cast<double>(bytes) * reps / s / 1e9);
  }
  return best;
}

struct Shared {
  std::unique_ptr<ShmCollectiveGroup> group;
  double memcpy_gbps = 0;
};

// One group per (floats, threads), made by thread 0 before the timed loop (which every thread
// enters together) and kept for the process's life.
Shared& SharedFor(int64_t floats, int threads) {
  static std::mutex mu;
  static std::map<std::pair<int64_t, int>, Shared> all;
  std::lock_guard<std::mutex> lock(mu);
  Shared& s = all[{floats, threads}];
  if (s.group == nullptr) {
    // As LlamaForward sets it: yield while waiting when the ranks outnumber the cores.
    const bool yield = static_cast<unsigned>(threads) > std::thread::hardware_concurrency();
    s.group = std::make_unique<ShmCollectiveGroup>(threads, floats, yield);
    s.memcpy_gbps = MemcpyGBps(floats * 4);
  }
  return s;
}

void BM_AllReduce(benchmark::State& state) {
  const int64_t floats = state.range(0);
  const int n = state.threads();
  Shared& shared = SharedFor(floats, n);
  std::vector<float> data(static_cast<size_t>(floats), 1.0f);
  Collective* rank = shared.group->rank(state.thread_index());
  const auto t0 = std::chrono::steady_clock::now();
  for (auto _ : state) {
    if (!rank->AllReduceSum(data.data(), floats).ok()) {
      state.SkipWithError("all-reduce failed");
      break;
    }
    std::fill_n(data.data(), 8, 1.0f);  // keep the sums finite
  }
  // The ranks run in lock step (every all-reduce waits for all), so thread 0's wall time is the
  // group's. Counters from thread 0 only (Google Benchmark sums them over threads).
  if (state.thread_index() == 0) {
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const double algbw =
        static_cast<double>(floats) * 4.0 * static_cast<double>(state.iterations()) / s / 1e9;
    const double busbw = algbw * 2.0 * (n - 1) / n;
    state.counters["algbw_GBps"] = algbw;
    state.counters["busbw_GBps"] = busbw;
    state.counters["memcpy_GBps"] = shared.memcpy_gbps;
    state.counters["ratio"] = busbw / shared.memcpy_gbps;
    state.counters["us_per_call"] = s / static_cast<double>(state.iterations()) * 1e6;
  }
}
BENCHMARK(BM_AllReduce)
    ->ArgName("floats")
    ->Arg(2048)
    ->Arg(64 * 2048)
    ->Arg(4 << 20)
    ->ThreadRange(2, 4)
    ->UseRealTime();

}  // namespace
}  // namespace pd::engine

BENCHMARK_MAIN();
