// TestDeviceBuffer for builds without CUDA/NCCL: no device, Allocate is Unimplemented.
#include "transport/testing/test_device_memory.h"

namespace pd::transport {

int TestDeviceCount() { return 0; }

absl::StatusOr<TestDeviceBuffer> TestDeviceBuffer::Allocate(uint64_t, int) {
  return absl::UnimplementedError(
      "test device memory needs a build with CUDA and NCCL (-DPD_ENABLE_NCCL=ON)");
}

TestDeviceBuffer::~TestDeviceBuffer() = default;

void TestDeviceBuffer::Free::operator()(void*) const {}

absl::Status TestDeviceBuffer::CopyFromHost(uint64_t, const void*, uint64_t) {
  return absl::UnimplementedError("test device memory: built without CUDA");
}

absl::Status TestDeviceBuffer::CopyToHost(uint64_t, void*, uint64_t) const {
  return absl::UnimplementedError("test device memory: built without CUDA");
}

}  // namespace pd::transport
