// Plain types shared by every kernel backend, including nvcc-compiled code: no Abseil, no glog,
// no STL beyond <cstdint>.
#pragma once

#include <cstdint>

namespace pd {
class ParallelFor;  // common/threads/parallel_for.h; only CPU kernels dereference it
}  // namespace pd

namespace pd::kernels {

// Where a tensor's memory lives. Decided when memory is placed, never per call.
enum class Device : uint8_t { kCpu = 0, kCuda = 1 };

// Element types of activations and KV caches.
enum class DType : uint8_t { kF32 = 0, kBF16 = 1, kF16 = 2 };

// Bytes per element of `dtype`.
constexpr int DTypeSize(DType dtype) { return dtype == DType::kF32 ? 4 : 2; }

// Execution context of one kernel call. Nothing in it is owned; pointers must outlive the call.
// `stream` is a cudaStream_t for kCuda (nullptr = the default stream) and unused for kCpu.
// `parallel` is the thread team that runs a CPU kernel's loops (the calling thread takes part);
// nullptr runs the kernel on the calling thread alone. Unused for kCuda.
struct OpContext {
  Device device = Device::kCpu;
  void* stream = nullptr;
  pd::ParallelFor* parallel = nullptr;
};

}  // namespace pd::kernels
