// Collectives of a tensor-parallel group (docs/engine.md, "Tensor parallelism"): the calls the
// ranks of one worker make together, each rank on its own thread, every rank the same calls in
// the same order.
//
// Collective is the interface the forward pass uses; ShmCollectiveGroup implements it for ranks
// that are threads of one process sharing its memory (the CPU engine). A GPU implementation
// (NCCL) will sit behind the same interface.
//
// Reproducibility: AllReduceSum adds the ranks' values in rank order, ((x0 + x1) + x2) + ...,
// whichever rank does the adding and however the threads are scheduled, so a result is the
// same bits run to run (and on every rank).
//
// Failure: a rank that fails between collectives calls Abort(); every rank blocked in a
// collective then, or entering one later, returns Aborted, so no rank waits forever for a
// peer that left. The group is usable again after Reset(), called once no rank is inside a
// collective.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"

namespace pd::engine {

class Collective {
 public:
  virtual ~Collective() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // data[i] = the sum over ranks, in rank order, of each rank's data[i]; n the same on every
  // rank. Aborted when the group was aborted.
  virtual absl::Status AllReduceSum(float* data, int64_t n) = 0;
  // Every rank contributes a [rows][cols] block (row stride `cols`, cols may differ between
  // ranks, rows may not) that lands at columns [col_begin, col_begin + cols) of every rank's
  // `out`, a [rows][out_stride] matrix. The ranks' column ranges must not overlap.
  virtual absl::Status AllGatherColumns(const float* local, int64_t rows, int64_t cols,
                                        int64_t col_begin, float* out, int64_t out_stride) = 0;
  // Returns once every rank has called it.
  virtual absl::Status Barrier() = 0;
  // Makes every pending and later collective of the group return Aborted (any rank may call).
  virtual void Abort() = 0;
  // Nanoseconds this rank has spent waiting for its peers in collectives, cumulative: how
  // unevenly the ranks' work is spread (any thread may read it).
  virtual int64_t WaitNanos() const = 0;
};

// A group of `size` ranks that are threads of this process. Thread-safe as documented above:
// rank r's Collective is used by one thread at a time.
class ShmCollectiveGroup {
 public:
  // size >= 1. `reduce_capacity` floats of shared scratch: longer reductions go in pieces.
  // A rank waiting for its peers spins up to 100 us, then sleeps; `yield` (for more busy
  // threads than cores) gives up the core while spinning, so a peer on the same core can run.
  ShmCollectiveGroup(int size, int64_t reduce_capacity, bool yield = false);
  ~ShmCollectiveGroup();
  ShmCollectiveGroup(const ShmCollectiveGroup&) = delete;
  ShmCollectiveGroup& operator=(const ShmCollectiveGroup&) = delete;

  int size() const { return size_; }
  Collective* rank(int r);
  // Clears an Abort(); only while no rank is inside a collective.
  void Reset();
  bool aborted() const { return (state_.load(std::memory_order_acquire) & 1u) != 0; }

 private:
  class Rank;
  absl::Status Barrier(int rank);
  void Abort();

  const int size_;
  const int64_t capacity_;
  const bool yield_;
  std::vector<float> scratch_;
  // Per rank: what it contributes to the current collective.
  struct Slot {
    const float* data = nullptr;
    int64_t cols = 0;
    int64_t col_begin = 0;
  };
  std::vector<Slot> slots_;
  std::unique_ptr<std::atomic<int64_t>[]> wait_ns_;  // per rank
  std::vector<std::unique_ptr<Rank>> ranks_;
  // Barrier: ranks arrived in the current round; (round << 1) | aborted, a futex word.
  alignas(64) std::atomic<int32_t> arrived_{0};
  alignas(64) std::atomic<uint32_t> state_{0};
};

}  // namespace pd::engine
