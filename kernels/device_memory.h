// Device memory, copies, streams and events for host code, without vendor headers: the memory
// side of kernels/ (the ops take pointers; this places what they point at).
//
// Devices (the kernels/dispatch pattern):
//   kCpu   plain host memory; copies are memcpy on the calling thread, streams and events are
//          no-ops (a CPU kernel has finished when its call returns).
//   kCuda  cudaMalloc'd memory of the current CUDA device (device 0 unless the process chose
//          another; select GPUs with CUDA_VISIBLE_DEVICES), cudaMemcpyAsync, cudaStream_t,
//          cudaEvent_t. Implemented in kernels/cuda; builds without CUDA return Unimplemented
//          naming PD_ENABLE_CUDA.
//
// Errors, for every kCuda function below:
//   Unimplemented       the build has no CUDA backend (message names PD_ENABLE_CUDA);
//   FailedPrecondition  no usable CUDA device ("no CUDA device", with the CUDA error name);
//   ResourceExhausted   an allocation does not fit (names the bytes);
//   Internal            any other CUDA error (names the call and the CUDA error), including a
//                       fault of earlier asynchronous work reported by a synchronising call.
//
// Ownership: DeviceBuffer, DeviceStream, DeviceEvent and HostRegistration are RAII, move-only
// handles that release what they own on destruction; a DeviceBuffer must outlive every queued
// operation that uses it (synchronise first). Thread-safety: the free functions are
// thread-safe; a handle is thread-compatible (one user at a time, or const use).
#pragma once

#include <cstdint>
#include <functional>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/types.h"

namespace pd::kernels {

// Whether this build implements memory for `device` (kCpu: always; kCuda: PD_ENABLE_CUDA).
bool DeviceMemoryBuilt(Device device);

// Number of usable devices: 1 for kCpu, the visible CUDA devices for kCuda (0 without a
// driver or a device, or in builds without CUDA). Never an error.
int DeviceCount(Device device);

// Memory of the current device: what is free now and the total (kCuda: cudaMemGetInfo).
// Unimplemented for kCpu (the host's memory is the operator's to size) and without a CUDA
// build; FailedPrecondition without a device.
struct DeviceMemoryInfo {
  int64_t free_bytes = 0;
  int64_t total_bytes = 0;
};
absl::StatusOr<DeviceMemoryInfo> QueryDeviceMemory(Device device);

// OK when memory can be placed on `device` now; the errors above (Unimplemented,
// FailedPrecondition "no CUDA device") otherwise. The startup check of `--device`.
absl::Status CheckDeviceAvailable(Device device);

// A zero-initialised allocation of `size_bytes` on one device, aligned to 256 bytes.
class DeviceBuffer {
 public:
  // InvalidArgument for size_bytes < 0. A 0-byte buffer has data() == nullptr and never fails.
  static absl::StatusOr<DeviceBuffer> Allocate(Device device, int64_t size_bytes);

  DeviceBuffer() = default;
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer();

  void* data() { return data_; }
  const void* data() const { return data_; }
  template <typename T>
  T* as() {
    return static_cast<T*>(data_);
  }
  int64_t size_bytes() const { return size_bytes_; }
  Device device() const { return device_; }

 private:
  void Release();

  Device device_ = Device::kCpu;
  void* data_ = nullptr;
  int64_t size_bytes_ = 0;
};

// Copies `bytes` from `src` to `dst`, queued on ctx.stream (kCuda) or done now (kCpu). Either
// pointer may be host or device memory (kCuda uses unified addressing, cudaMemcpyDefault).
// With pageable host memory CUDA may complete the copy before returning; with device or
// page-locked memory it returns at once: the caller keeps both ranges alive and unmodified
// until the stream is synchronised. The ranges must not overlap. bytes == 0 does nothing.
// InvalidArgument for bytes < 0 or a null pointer with bytes > 0.
absl::Status CopyAsync(const OpContext& ctx, void* dst, const void* src, int64_t bytes);

// Sets `bytes` bytes at `dst` (device memory, or host memory on kCpu) to zero, queued on
// ctx.stream (kCuda) or done now (kCpu). bytes == 0 does nothing. InvalidArgument for bytes < 0
// or a null dst with bytes > 0.
absl::Status ZeroAsync(const OpContext& ctx, void* dst, int64_t bytes);

// Waits for all work queued on ctx.stream (nullptr = the default stream); a no-op for kCpu.
absl::Status SynchronizeStream(const OpContext& ctx);

// An owned stream (kCuda: a non-blocking cudaStream_t; kCpu: none, handle() == nullptr).
class DeviceStream {
 public:
  static absl::StatusOr<DeviceStream> Create(Device device);

  DeviceStream() = default;
  DeviceStream(DeviceStream&& other) noexcept;
  DeviceStream& operator=(DeviceStream&& other) noexcept;
  DeviceStream(const DeviceStream&) = delete;
  DeviceStream& operator=(const DeviceStream&) = delete;
  ~DeviceStream();

  // For OpContext::stream.
  void* handle() const { return handle_; }
  Device device() const { return device_; }
  // An OpContext on this stream (parallel unset).
  OpContext context() const { return OpContext{device_, handle_, nullptr}; }
  absl::Status Synchronize() const;

 private:
  void Release();

  Device device_ = Device::kCpu;
  void* handle_ = nullptr;
};

// An owned event without timing (kCuda: cudaEvent_t with cudaEventDisableTiming; kCpu: always
// complete).
class DeviceEvent {
 public:
  static absl::StatusOr<DeviceEvent> Create(Device device);

  DeviceEvent() = default;
  DeviceEvent(DeviceEvent&& other) noexcept;
  DeviceEvent& operator=(DeviceEvent&& other) noexcept;
  DeviceEvent(const DeviceEvent&) = delete;
  DeviceEvent& operator=(const DeviceEvent&) = delete;
  ~DeviceEvent();

  // Marks the current end of ctx.stream's queue. InvalidArgument when ctx.device differs from
  // the event's device.
  absl::Status Record(const OpContext& ctx);
  // Whether the work before the last Record has completed (true if never recorded).
  absl::StatusOr<bool> Query() const;
  // Waits for it.
  absl::Status Synchronize() const;
  Device device() const { return device_; }

 private:
  void Release();

  Device device_ = Device::kCpu;
  void* handle_ = nullptr;
};

// Recorded work replayed as one launch (issue #16 item 2): on kCuda a CUDA graph captured from
// what `body` queues on ctx.stream (the kernels and device-to-device copies; the pointers and
// scalars they were given are baked in, so every replay reads the same buffers). On kCpu there
// is nothing to capture: Capture keeps `body` and each Launch runs it, an emulation that lets
// callers' graph logic run in CPU tests.
class DeviceGraph {
 public:
  // Records `body` without running it (kCuda). Errors: body's own error; FailedPrecondition for
  // the default stream (it cannot be captured); Internal when CUDA invalidates the capture
  // (body queued something a graph cannot hold, e.g. a copy from pageable host memory) or
  // cannot instantiate it. Unimplemented without a CUDA build. Nothing runs on failure either.
  static absl::StatusOr<DeviceGraph> Capture(const OpContext& ctx,
                                             std::function<absl::Status()> body);

  DeviceGraph() = default;
  DeviceGraph(DeviceGraph&& other) noexcept;
  DeviceGraph& operator=(DeviceGraph&& other) noexcept;
  DeviceGraph(const DeviceGraph&) = delete;
  DeviceGraph& operator=(const DeviceGraph&) = delete;
  ~DeviceGraph();

  // Queues one replay on ctx.stream (kCuda) or runs the body now (kCpu). FailedPrecondition for
  // an empty graph, InvalidArgument for a ctx of another device.
  absl::Status Launch(const OpContext& ctx) const;
  bool empty() const { return exec_ == nullptr && !body_; }

 private:
  void Release();

  Device device_ = Device::kCpu;
  void* exec_ = nullptr;                // cudaGraphExec_t
  std::function<absl::Status()> body_;  // kCpu
};

// Page-locks a host range for the device (kCuda: cudaHostRegister, so cudaMemcpyAsync to and
// from it is truly asynchronous and the kernels may address it; kCpu: nothing). Unregisters
// on destruction; the range must stay mapped until then.
class HostRegistration {
 public:
  // InvalidArgument for a null pointer or bytes <= 0.
  static absl::StatusOr<HostRegistration> Register(Device device, void* host, int64_t bytes);

  HostRegistration() = default;
  HostRegistration(HostRegistration&& other) noexcept;
  HostRegistration& operator=(HostRegistration&& other) noexcept;
  HostRegistration(const HostRegistration&) = delete;
  HostRegistration& operator=(const HostRegistration&) = delete;
  ~HostRegistration();

  bool registered() const { return host_ != nullptr; }

 private:
  void Release();

  Device device_ = Device::kCpu;
  void* host_ = nullptr;
};

}  // namespace pd::kernels
