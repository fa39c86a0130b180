// TestDeviceBuffer: CUDA device memory for test pools (conformance suites, the conformance
// peer, pd-kvbench) without including CUDA headers outside transport/nccl. Builds with NCCL
// (hence CUDA) use transport/nccl/test_device_memory_cuda.cc; other builds link
// testing/test_device_memory_none.cc, whose Allocate answers Unimplemented. Test-only.
//
// Thread-compatible. Every call makes `device` current on the calling thread and restores the
// previous device.
#pragma once

#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace pd::transport {

// Usable CUDA devices (0 without a driver, a device, or CUDA support in this build).
int TestDeviceCount();

class TestDeviceBuffer {
 public:
  // cudaMalloc of `bytes` on `device`. Unimplemented in builds without CUDA; ResourceExhausted
  // or Internal for CUDA failures.
  static absl::StatusOr<TestDeviceBuffer> Allocate(uint64_t bytes, int device);

  TestDeviceBuffer(TestDeviceBuffer&&) = default;
  TestDeviceBuffer& operator=(TestDeviceBuffer&&) = default;
  ~TestDeviceBuffer();

  void* data() const { return data_.get(); }
  uint64_t size() const { return size_; }
  int device() const { return device_; }

  // Synchronous copies between host memory and [offset, offset + n) of the buffer.
  // OutOfRange when the range leaves the buffer.
  absl::Status CopyFromHost(uint64_t offset, const void* src, uint64_t n);
  absl::Status CopyToHost(uint64_t offset, void* dst, uint64_t n) const;

 private:
  struct Free {
    int device = 0;
    void operator()(void* p) const;
  };
  TestDeviceBuffer(void* p, uint64_t size, int device)
      : data_(p, Free{device}), size_(size), device_(device) {}
  std::unique_ptr<void, Free> data_;
  uint64_t size_ = 0;
  int device_ = 0;
};

}  // namespace pd::transport
