// Helpers of the GPU tests (label gpu): device buffers and the skip rule. Test-only; CUDA
// runtime included, so only kernels/cuda/*_cuda_test.cc include it.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
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
