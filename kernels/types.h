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

// Element types of activations, weights and KV caches. kI8, kF8E4M3 and kI4 are quantized
// KV-cache dtypes (per (token, kv head) row codes with f32 scales stored in the block, see
// kernels/attention_params.h); kI8 is also a MatMul weight dtype (per output row scales, see
// kernels/matmul_params.h). Every other op rejects them.
enum class DType : uint8_t { kF32 = 0, kBF16 = 1, kF16 = 2, kI8 = 3, kF8E4M3 = 4, kI4 = 5 };

// Bytes per element of `dtype` (for the quantized dtypes: of the data, without the scales).
// kI4 packs two codes a byte: its unit of storage (and of a KvCacheView's strides) is the byte,
// so it counts 1 here; KvRowPitch (kernels/attention_params.h) gives a row's bytes.
constexpr int DTypeSize(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return 4;
    case DType::kBF16:
    case DType::kF16:
      return 2;
    case DType::kI8:
    case DType::kF8E4M3:
    case DType::kI4:
      return 1;
  }
  return 0;
}

// Whether `dtype` is a quantized KV-cache dtype (codes plus per-row or per-group f32 scales).
constexpr bool IsQuantizedKvDType(DType dtype) {
  return dtype == DType::kI8 || dtype == DType::kF8E4M3 || dtype == DType::kI4;
}

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
