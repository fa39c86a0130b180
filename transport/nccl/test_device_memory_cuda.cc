// TestDeviceBuffer on the CUDA runtime (builds with NCCL). Test-only.
#include <cuda_runtime.h>

#include "absl/strings/str_cat.h"
#include "transport/testing/test_device_memory.h"

namespace pd::transport {
namespace {

class DeviceScope {
 public:
  explicit DeviceScope(int device) {
    if (cudaGetDevice(&previous_) != cudaSuccess) {
      previous_ = -1;
    }
    status_ = cudaSetDevice(device);
  }
  ~DeviceScope() {
    if (previous_ >= 0) {
      cudaSetDevice(previous_);
    }
  }
  cudaError_t status() const { return status_; }

 private:
  int previous_ = -1;
  cudaError_t status_ = cudaSuccess;
};

absl::Status CudaStatus(cudaError_t e, absl::string_view what) {
  if (e == cudaSuccess) {
    return absl::OkStatus();
  }
  cudaGetLastError();
  const std::string msg = absl::StrCat(what, ": ", cudaGetErrorString(e));
  return e == cudaErrorMemoryAllocation ? absl::ResourceExhaustedError(msg)
                                        : absl::InternalError(msg);
}

}  // namespace

int TestDeviceCount() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

absl::StatusOr<TestDeviceBuffer> TestDeviceBuffer::Allocate(uint64_t bytes, int device) {
  DeviceScope scope(device);
  if (scope.status() != cudaSuccess) {
    return CudaStatus(scope.status(), absl::StrCat("cudaSetDevice(", device, ")"));
  }
  void* p = nullptr;
  const cudaError_t e = cudaMalloc(&p, bytes);
  if (e != cudaSuccess) {
    return CudaStatus(e, absl::StrCat("cudaMalloc(", bytes, ") on device ", device));
  }
  return TestDeviceBuffer(p, bytes, device);
}

TestDeviceBuffer::~TestDeviceBuffer() = default;

void TestDeviceBuffer::Free::operator()(void* p) const {
  DeviceScope scope(device);
  cudaFree(p);
}

absl::Status TestDeviceBuffer::CopyFromHost(uint64_t offset, const void* src, uint64_t n) {
  if (offset > size_ || n > size_ - offset) {
    return absl::OutOfRangeError(
        absl::StrCat("copy of ", n, " bytes at ", offset, " leaves a buffer of ", size_));
  }
  DeviceScope scope(device_);
  return CudaStatus(cudaMemcpy(static_cast<char*>(data()) + offset, src, n, cudaMemcpyHostToDevice),
                    "cudaMemcpy host->device");
}

absl::Status TestDeviceBuffer::CopyToHost(uint64_t offset, void* dst, uint64_t n) const {
  if (offset > size_ || n > size_ - offset) {
    return absl::OutOfRangeError(
        absl::StrCat("copy of ", n, " bytes at ", offset, " leaves a buffer of ", size_));
  }
  DeviceScope scope(device_);
  return CudaStatus(
      cudaMemcpy(dst, static_cast<const char*>(data()) + offset, n, cudaMemcpyDeviceToHost),
      "cudaMemcpy device->host");
}

}  // namespace pd::transport
