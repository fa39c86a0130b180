// ScoreBufferPool: device buffers for the H2O / SnapKV scores of governed sequences
// (KvScores::device; docs/engine.md, "H2O and SnapKV KV policies"), kept for the next sequence
// instead of freed. On CUDA a buffer is a cudaMalloc at admission and a cudaFree when the
// sequence ends, is preempted or has been compressed, and both synchronise the device: with
// many governed requests that is a stall at every admission. A buffer given back stays here
// and the next sequence of at most its size takes it, zeroed on the forward pass's stream.
//
// Thread-safety: thread-safe (a sequence may be destroyed off the scheduler thread). A buffer
// is given back only when no queued work uses it: the forward pass synchronises every step.
#pragma once

#include <cstdint>
#include <map>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "kernels/device_memory.h"

namespace pd::engine {

class ScoreBufferPool {
 public:
  // Free buffers kept, in bytes, at most (past it the largest are freed).
  static constexpr int64_t kDefaultMaxFreeBytes = int64_t{256} << 20;

  explicit ScoreBufferPool(kernels::Device device, int64_t max_free_bytes = kDefaultMaxFreeBytes)
      : device_(device), max_free_bytes_(max_free_bytes) {}

  // A buffer of at least `bytes` (> 0) whose first `bytes` are zero (queued on ctx's stream):
  // the smallest free one of at most twice `bytes`, or a new one. The allocator's errors
  // (ResourceExhausted naming the bytes).
  absl::StatusOr<kernels::DeviceBuffer> Take(const kernels::OpContext& ctx, int64_t bytes);
  // Keeps `buffer` for a later Take (an empty one is dropped).
  void Give(kernels::DeviceBuffer buffer);

  struct Stats {
    int64_t allocated = 0;   // Take calls that allocated
    int64_t reused = 0;      // Take calls served by a kept buffer
    int64_t free_bytes = 0;  // kept now
  };
  Stats stats();

 private:
  const kernels::Device device_;
  const int64_t max_free_bytes_;
  absl::Mutex mu_;
  std::multimap<int64_t, kernels::DeviceBuffer> free_ ABSL_GUARDED_BY(mu_);  // by size
  Stats stats_ ABSL_GUARDED_BY(mu_);
};

}  // namespace pd::engine
