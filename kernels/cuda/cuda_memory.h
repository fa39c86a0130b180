// CUDA runtime calls behind kernels/device_memory.h, for kernels/dispatch. No vendor headers
// here: streams and events travel as void* (cudaStream_t / cudaEvent_t). Every function works
// on the current CUDA device. Errors as kernels/device_memory.h lists them: FailedPrecondition
// "no CUDA device" when the runtime finds no driver or device, ResourceExhausted for an
// allocation that does not fit, Internal with the call and CUDA error name otherwise.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace pd::kernels::cuda {

// cudaMalloc + cudaMemset to zero, complete when this returns. bytes > 0.
absl::StatusOr<void*> DeviceAlloc(int64_t bytes);
// cudaFree (which waits for the device); errors are ignored: nothing can be done about them
// while memory is released.
void DeviceFree(void* p);

// cudaMemcpyAsync(cudaMemcpyDefault) on `stream`.
absl::Status MemcpyAsync(void* dst, const void* src, int64_t bytes, void* stream);
// cudaMemsetAsync(dst, 0) on `stream`.
absl::Status ZeroAsync(void* dst, int64_t bytes, void* stream);

absl::Status StreamSynchronize(void* stream);
// cudaStreamCreateWithFlags(cudaStreamNonBlocking).
absl::StatusOr<void*> StreamCreate();
void StreamDestroy(void* stream);

// cudaEventCreateWithFlags(cudaEventDisableTiming).
absl::StatusOr<void*> EventCreate();
void EventDestroy(void* event);
absl::Status EventRecord(void* event, void* stream);
// true when complete (cudaSuccess), false while pending (cudaErrorNotReady).
absl::StatusOr<bool> EventQuery(void* event);
absl::Status EventSynchronize(void* event);

// cudaHostRegister(cudaHostRegisterPortable) / cudaHostUnregister.
absl::Status HostRegister(void* host, int64_t bytes);
void HostUnregister(void* host);

// CUDA graphs: cudaStreamBeginCapture (thread-local mode, so other threads' CUDA calls do not
// invalidate it); GraphEndCapture ends it and instantiates the graph (an Internal error when
// the capture was invalidated, e.g. by a synchronous call inside it; the capture is ended
// either way); GraphLaunch replays it on `stream`.
absl::Status GraphBeginCapture(void* stream);
absl::StatusOr<void*> GraphEndCapture(void* stream);
absl::Status GraphLaunch(void* exec, void* stream);
void GraphExecDestroy(void* exec);

// cudaMemGetInfo of the current device.
absl::Status MemGetInfo(int64_t* free_bytes, int64_t* total_bytes);

// OK when at least one device is usable; FailedPrecondition "no CUDA device" otherwise.
absl::Status CheckDevice();

}  // namespace pd::kernels::cuda
