#include "engine/scheduler/score_buffers.h"

#include <utility>
#include <vector>

#include "common/base/status_macros.h"

namespace pd::engine {

absl::StatusOr<kernels::DeviceBuffer> ScoreBufferPool::Take(const kernels::OpContext& ctx,
                                                            int64_t bytes) {
  kernels::DeviceBuffer buffer;
  {
    absl::MutexLock lock(&mu_);
    auto it = free_.lower_bound(bytes);
    if (it != free_.end() && it->first <= 2 * bytes) {
      buffer = std::move(it->second);
      stats_.free_bytes -= it->first;
      free_.erase(it);
      ++stats_.reused;
    }
  }
  if (buffer.data() != nullptr) {
    // The last sequence's scores are still there.
    absl::Status zeroed = kernels::ZeroAsync(ctx, buffer.data(), bytes);
    if (!zeroed.ok()) {
      Give(std::move(buffer));
      return zeroed;
    }
    return buffer;
  }
  PD_ASSIGN_OR_RETURN(buffer, kernels::DeviceBuffer::Allocate(device_, bytes));  // zeroed
  absl::MutexLock lock(&mu_);
  ++stats_.allocated;
  return buffer;
}

void ScoreBufferPool::Give(kernels::DeviceBuffer buffer) {
  if (buffer.data() == nullptr) return;
  std::vector<kernels::DeviceBuffer> dropped;  // freed after the lock is released
  absl::MutexLock lock(&mu_);
  const int64_t size = buffer.size_bytes();
  stats_.free_bytes += size;
  free_.emplace(size, std::move(buffer));
  while (stats_.free_bytes > max_free_bytes_ && !free_.empty()) {
    auto largest = std::prev(free_.end());
    stats_.free_bytes -= largest->first;
    dropped.push_back(std::move(largest->second));
    free_.erase(largest);
  }
}

ScoreBufferPool::Stats ScoreBufferPool::stats() {
  absl::MutexLock lock(&mu_);
  return stats_;
}

}  // namespace pd::engine
