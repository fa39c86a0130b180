#include "kernels/cuda/cuda_memory.h"

#include <cuda_runtime.h>

#include "absl/strings/str_cat.h"

namespace pd::kernels::cuda {
namespace {

// No driver, no device, or a device the runtime cannot use: the machine has no GPU for us.
bool IsNoDevice(cudaError_t err) {
  return err == cudaErrorNoDevice || err == cudaErrorInsufficientDriver ||
         err == cudaErrorInitializationError || err == cudaErrorDevicesUnavailable ||
         err == cudaErrorStubLibrary || err == cudaErrorSystemDriverMismatch ||
         err == cudaErrorCompatNotSupportedOnDevice;
}

std::string ErrorText(cudaError_t err) {
  return absl::StrCat(cudaGetErrorName(err), " (", cudaGetErrorString(err), ")");
}

absl::Status FromCuda(cudaError_t err, absl::string_view what) {
  if (err == cudaSuccess) {
    return absl::OkStatus();
  }
  // Reset the (non-sticky) last-error state so a later unrelated call does not report it.
  (void)cudaGetLastError();
  if (IsNoDevice(err)) {
    return absl::FailedPreconditionError(
        absl::StrCat("no CUDA device: ", what, ": ", ErrorText(err)));
  }
  return absl::InternalError(absl::StrCat(what, ": ", ErrorText(err)));
}

cudaStream_t AsStream(void* s) { return static_cast<cudaStream_t>(s); }
cudaEvent_t AsEvent(void* e) { return static_cast<cudaEvent_t>(e); }

}  // namespace

absl::Status CheckDevice() {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    return absl::FailedPreconditionError(
        absl::StrCat("no CUDA device: cudaGetDeviceCount: ", ErrorText(err)));
  }
  if (count == 0) {
    return absl::FailedPreconditionError("no CUDA device: cudaGetDeviceCount found 0 devices");
  }
  return absl::OkStatus();
}

absl::StatusOr<void*> DeviceAlloc(int64_t bytes) {
  void* p = nullptr;
  const cudaError_t err = cudaMalloc(&p, static_cast<size_t>(bytes));
  if (err == cudaErrorMemoryAllocation) {
    (void)cudaGetLastError();
    return absl::ResourceExhaustedError(
        absl::StrCat("cudaMalloc of ", bytes, " bytes: ", ErrorText(err)));
  }
  if (err != cudaSuccess) {
    return FromCuda(err, absl::StrCat("cudaMalloc of ", bytes, " bytes"));
  }
  // cudaMemset of device memory may return before it completes, on the legacy default stream,
  // which our non-blocking streams do not wait for: wait here, so the zeros land before any
  // work on any stream can touch the buffer.
  cudaError_t set = cudaMemset(p, 0, static_cast<size_t>(bytes));
  if (set == cudaSuccess) {
    set = cudaStreamSynchronize(cudaStreamLegacy);
  }
  if (set != cudaSuccess) {
    (void)cudaFree(p);
    return FromCuda(set, absl::StrCat("cudaMemset of ", bytes, " bytes"));
  }
  return p;
}

void DeviceFree(void* p) {
  if (p != nullptr && cudaFree(p) != cudaSuccess) {
    (void)cudaGetLastError();
  }
}

absl::Status MemcpyAsync(void* dst, const void* src, int64_t bytes, void* stream) {
  return FromCuda(
      cudaMemcpyAsync(dst, src, static_cast<size_t>(bytes), cudaMemcpyDefault, AsStream(stream)),
      absl::StrCat("cudaMemcpyAsync of ", bytes, " bytes"));
}

absl::Status ZeroAsync(void* dst, int64_t bytes, void* stream) {
  return FromCuda(cudaMemsetAsync(dst, 0, static_cast<size_t>(bytes), AsStream(stream)),
                  absl::StrCat("cudaMemsetAsync of ", bytes, " bytes"));
}

absl::Status StreamSynchronize(void* stream) {
  return FromCuda(cudaStreamSynchronize(AsStream(stream)), "cudaStreamSynchronize");
}

absl::StatusOr<void*> StreamCreate() {
  cudaStream_t s = nullptr;
  const cudaError_t err = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  if (err != cudaSuccess) {
    return FromCuda(err, "cudaStreamCreateWithFlags");
  }
  return static_cast<void*>(s);
}

void StreamDestroy(void* stream) {
  if (stream != nullptr && cudaStreamDestroy(AsStream(stream)) != cudaSuccess) {
    (void)cudaGetLastError();
  }
}

absl::Status MemGetInfo(int64_t* free_bytes, int64_t* total_bytes) {
  size_t free = 0, total = 0;
  const cudaError_t err = cudaMemGetInfo(&free, &total);
  if (err != cudaSuccess) {
    return FromCuda(err, "cudaMemGetInfo");
  }
  *free_bytes = static_cast<int64_t>(free);
  *total_bytes = static_cast<int64_t>(total);
  return absl::OkStatus();
}

absl::Status GraphBeginCapture(void* stream) {
  return FromCuda(cudaStreamBeginCapture(AsStream(stream), cudaStreamCaptureModeThreadLocal),
                  "cudaStreamBeginCapture");
}

absl::StatusOr<void*> GraphEndCapture(void* stream) {
  cudaGraph_t graph = nullptr;
  const cudaError_t end = cudaStreamEndCapture(AsStream(stream), &graph);
  if (end != cudaSuccess) {
    if (graph != nullptr) {
      cudaGraphDestroy(graph);
    }
    (void)cudaGetLastError();
    return FromCuda(end, "cudaStreamEndCapture");
  }
  cudaGraphExec_t exec = nullptr;
  const cudaError_t inst = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);
  if (inst != cudaSuccess) {
    (void)cudaGetLastError();
    return FromCuda(inst, "cudaGraphInstantiate");
  }
  return static_cast<void*>(exec);
}

absl::Status GraphLaunch(void* exec, void* stream) {
  return FromCuda(cudaGraphLaunch(static_cast<cudaGraphExec_t>(exec), AsStream(stream)),
                  "cudaGraphLaunch");
}

void GraphExecDestroy(void* exec) {
  if (exec != nullptr && cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(exec)) != cudaSuccess) {
    (void)cudaGetLastError();
  }
}

absl::StatusOr<void*> EventCreate() {
  cudaEvent_t e = nullptr;
  const cudaError_t err = cudaEventCreateWithFlags(&e, cudaEventDisableTiming);
  if (err != cudaSuccess) {
    return FromCuda(err, "cudaEventCreateWithFlags");
  }
  return static_cast<void*>(e);
}

void EventDestroy(void* event) {
  if (event != nullptr && cudaEventDestroy(AsEvent(event)) != cudaSuccess) {
    (void)cudaGetLastError();
  }
}

absl::Status EventRecord(void* event, void* stream) {
  return FromCuda(cudaEventRecord(AsEvent(event), AsStream(stream)), "cudaEventRecord");
}

absl::StatusOr<bool> EventQuery(void* event) {
  const cudaError_t err = cudaEventQuery(AsEvent(event));
  if (err == cudaSuccess) {
    return true;
  }
  if (err == cudaErrorNotReady) {
    (void)cudaGetLastError();
    return false;
  }
  return FromCuda(err, "cudaEventQuery");
}

absl::Status EventSynchronize(void* event) {
  return FromCuda(cudaEventSynchronize(AsEvent(event)), "cudaEventSynchronize");
}

absl::Status HostRegister(void* host, int64_t bytes) {
  return FromCuda(cudaHostRegister(host, static_cast<size_t>(bytes), cudaHostRegisterPortable),
                  absl::StrCat("cudaHostRegister of ", bytes, " bytes"));
}

void HostUnregister(void* host) {
  if (host != nullptr && cudaHostUnregister(host) != cudaSuccess) {
    (void)cudaGetLastError();
  }
}

}  // namespace pd::kernels::cuda
