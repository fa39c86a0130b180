// Helpers of the GPU tests (label gpu): device buffers and the skip rule. Test-only; CUDA
// runtime included, so only kernels/cuda/*_cuda_test.cc include it.
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/types.h"

// Skips the test on machines without a usable CUDA device (no driver: cudaGetDeviceCount
// returns cudaErrorInsufficientDriver there).
#define PD_SKIP_WITHOUT_GPU()                             \
  do {                                                    \
    if (::pd::kernels::cuda::VisibleDeviceCount() == 0) { \
      GTEST_SKIP() << "no CUDA device";                   \
    }                                                     \
  } while (0)

namespace pd::kernels::cuda::testing {

// Bitwise equality of f32 results, where a NaN equals any NaN: NVIDIA GPUs return the
// canonical NaN (0x7fffffff) from arithmetic on a NaN, x86 keeps the operand's payload
// (0x7fc00000 for quiet_NaN), so "bitwise the CPU" holds for every number but a NaN's payload.
// On a mismatch the message names how many differ and the first one, with both bit patterns.
inline ::testing::AssertionResult BitwiseOrBothNaN(const std::vector<float>& got,
                                                   const std::vector<float>& want) {
  if (got.size() != want.size()) {
    return ::testing::AssertionFailure() << "sizes " << got.size() << " vs " << want.size();
  }
  int64_t differ = 0, first = -1;
  for (size_t i = 0; i < got.size(); ++i) {
    const bool same = std::isnan(got[i]) ? std::isnan(want[i])
                                         : std::memcmp(&got[i], &want[i], sizeof(float)) == 0;
    if (!same) {
      first = first < 0 ? static_cast<int64_t>(i) : first;
      ++differ;
    }
  }
  if (differ == 0) {
    return ::testing::AssertionSuccess();
  }
  uint32_t gb = 0, wb = 0;
  std::memcpy(&gb, &got[first], 4);
  std::memcpy(&wb, &want[first], 4);
  return ::testing::AssertionFailure()
         << differ << " of " << got.size() << " values differ; the first at " << first << ": "
         << got[first] << " (0x" << std::hex << gb << ") vs " << want[first] << " (0x" << wb
         << std::dec << ")";
}

inline OpContext CudaCtx(cudaStream_t stream = nullptr) {
  OpContext ctx;
  ctx.device = Device::kCuda;
  ctx.stream = stream;
  return ctx;
}

// Device memory of a fixed size, freed on destruction. Failures are test failures.
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t bytes) : bytes_(bytes) {
    if (cudaMalloc(&ptr_, bytes == 0 ? 1 : bytes) != cudaSuccess) {
      ADD_FAILURE() << "cudaMalloc of " << bytes << " bytes failed";
      ptr_ = nullptr;
    }
  }
  template <typename T>
  explicit DeviceBuffer(const std::vector<T>& host) : DeviceBuffer(host.size() * sizeof(T)) {
    Upload(host);
  }
  DeviceBuffer(DeviceBuffer&& o) noexcept
      : ptr_(std::exchange(o.ptr_, nullptr)), bytes_(o.bytes_) {}
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() {
    if (ptr_ != nullptr) {
      cudaFree(ptr_);
    }
  }

  template <typename T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }
  void* get() const { return ptr_; }

  template <typename T>
  void Upload(const std::vector<T>& host) {
    ASSERT_EQ(host.size() * sizeof(T), bytes_);
    ASSERT_EQ(cudaMemcpy(ptr_, host.data(), bytes_, cudaMemcpyHostToDevice), cudaSuccess);
  }

  // Waits for all queued work, then copies the buffer back.
  template <typename T>
  std::vector<T> Download() const {
    std::vector<T> host(bytes_ / sizeof(T));
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(host.data(), ptr_, bytes_, cudaMemcpyDeviceToHost), cudaSuccess);
    return host;
  }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace pd::kernels::cuda::testing
