// Device routing of kernels/device_memory.h: kCpu here, kCuda in kernels/cuda/cuda_memory.cc.
#include "kernels/device_memory.h"

#include <cstdlib>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "build_config.h"
#include "common/base/status_macros.h"
#if PD_WITH_CUDA
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/cuda_memory.h"
#endif

namespace pd::kernels {
namespace {

constexpr int64_t kAlignment = 256;  // cudaMalloc's guarantee; the same on the host

#if !PD_WITH_CUDA
absl::Status NoCuda(absl::string_view what) {
  return absl::UnimplementedError(absl::StrCat(
      what, ": this build has no CUDA backend (configure with -DPD_ENABLE_CUDA=ON and nvcc)"));
}
#endif

}  // namespace

bool DeviceMemoryBuilt(Device device) {
  switch (device) {
    case Device::kCpu:
      return true;
    case Device::kCuda:
      return PD_WITH_CUDA;
  }
  return false;
}

int DeviceCount(Device device) {
  switch (device) {
    case Device::kCpu:
      return 1;
    case Device::kCuda:
#if PD_WITH_CUDA
      return cuda::VisibleDeviceCount();
#else
      return 0;
#endif
  }
  return 0;
}

absl::StatusOr<DeviceMemoryInfo> QueryDeviceMemory(Device device) {
  if (device == Device::kCpu) {
    return absl::UnimplementedError("device memory query: not for the host (cpu)");
  }
#if PD_WITH_CUDA
  PD_RETURN_IF_ERROR(cuda::CheckDevice());
  DeviceMemoryInfo info;
  PD_RETURN_IF_ERROR(cuda::MemGetInfo(&info.free_bytes, &info.total_bytes));
  return info;
#else
  return NoCuda("device memory query");
#endif
}

absl::Status CheckDeviceAvailable(Device device) {
  if (device == Device::kCpu) {
    return absl::OkStatus();
  }
#if PD_WITH_CUDA
  return cuda::CheckDevice();
#else
  return NoCuda("device cuda");
#endif
}

// --- DeviceBuffer ---

absl::StatusOr<DeviceBuffer> DeviceBuffer::Allocate(Device device, int64_t size_bytes) {
  if (size_bytes < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("device buffer: size_bytes must be >= 0, got ", size_bytes));
  }
  DeviceBuffer b;
  b.device_ = device;
  if (size_bytes == 0) {
    return b;
  }
  if (device == Device::kCpu) {
    const int64_t rounded = (size_bytes + kAlignment - 1) / kAlignment * kAlignment;
    void* p = std::aligned_alloc(kAlignment, static_cast<size_t>(rounded));
    if (p == nullptr) {
      return absl::ResourceExhaustedError(
          absl::StrCat("device buffer: host allocation of ", size_bytes, " bytes failed"));
    }
    std::memset(p, 0, static_cast<size_t>(rounded));
    b.data_ = p;
  } else {
#if PD_WITH_CUDA
    absl::StatusOr<void*> p = cuda::DeviceAlloc(size_bytes);
    if (!p.ok()) {
      return p.status();
    }
    b.data_ = *p;
#else
    return NoCuda("device buffer");
#endif
  }
  b.size_bytes_ = size_bytes;
  return b;
}

DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept
    : device_(other.device_),
      data_(std::exchange(other.data_, nullptr)),
      size_bytes_(std::exchange(other.size_bytes_, 0)) {}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    Release();
    device_ = other.device_;
    data_ = std::exchange(other.data_, nullptr);
    size_bytes_ = std::exchange(other.size_bytes_, 0);
  }
  return *this;
}

DeviceBuffer::~DeviceBuffer() { Release(); }

void DeviceBuffer::Release() {
  if (data_ == nullptr) {
    return;
  }
  if (device_ == Device::kCpu) {
    std::free(data_);
  } else {
#if PD_WITH_CUDA
    cuda::DeviceFree(data_);
#endif
  }
  data_ = nullptr;
  size_bytes_ = 0;
}

// --- copies and streams ---

absl::Status CopyAsync(const OpContext& ctx, void* dst, const void* src, int64_t bytes) {
  if (bytes < 0) {
    return absl::InvalidArgumentError(absl::StrCat("copy: bytes must be >= 0, got ", bytes));
  }
  if (bytes == 0) {
    return absl::OkStatus();
  }
  if (dst == nullptr || src == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("copy: null src or dst for ", bytes, " bytes"));
  }
  if (ctx.device == Device::kCpu) {
    std::memcpy(dst, src, static_cast<size_t>(bytes));
    return absl::OkStatus();
  }
#if PD_WITH_CUDA
  return cuda::MemcpyAsync(dst, src, bytes, ctx.stream);
#else
  return NoCuda("copy");
#endif
}

absl::Status ZeroAsync(const OpContext& ctx, void* dst, int64_t bytes) {
  if (bytes < 0) {
    return absl::InvalidArgumentError(absl::StrCat("zero: bytes must be >= 0, got ", bytes));
  }
  if (bytes == 0) {
    return absl::OkStatus();
  }
  if (dst == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("zero: null dst for ", bytes, " bytes"));
  }
  if (ctx.device == Device::kCpu) {
    std::memset(dst, 0, static_cast<size_t>(bytes));
    return absl::OkStatus();
  }
#if PD_WITH_CUDA
  return cuda::ZeroAsync(dst, bytes, ctx.stream);
#else
  return NoCuda("zero");
#endif
}

absl::Status SynchronizeStream(const OpContext& ctx) {
  if (ctx.device == Device::kCpu) {
    return absl::OkStatus();
  }
#if PD_WITH_CUDA
  return cuda::StreamSynchronize(ctx.stream);
#else
  return NoCuda("stream synchronize");
#endif
}

absl::StatusOr<DeviceStream> DeviceStream::Create(Device device) {
  DeviceStream s;
  s.device_ = device;
  if (device == Device::kCuda) {
#if PD_WITH_CUDA
    absl::StatusOr<void*> h = cuda::StreamCreate();
    if (!h.ok()) {
      return h.status();
    }
    s.handle_ = *h;
#else
    return NoCuda("stream");
#endif
  }
  return s;
}

DeviceStream::DeviceStream(DeviceStream&& other) noexcept
    : device_(other.device_), handle_(std::exchange(other.handle_, nullptr)) {}

DeviceStream& DeviceStream::operator=(DeviceStream&& other) noexcept {
  if (this != &other) {
    Release();
    device_ = other.device_;
    handle_ = std::exchange(other.handle_, nullptr);
  }
  return *this;
}

DeviceStream::~DeviceStream() { Release(); }

void DeviceStream::Release() {
#if PD_WITH_CUDA
  if (device_ == Device::kCuda) {
    cuda::StreamDestroy(handle_);
  }
#endif
  handle_ = nullptr;
}

absl::Status DeviceStream::Synchronize() const { return SynchronizeStream(context()); }

// --- graphs ---

absl::StatusOr<DeviceGraph> DeviceGraph::Capture(const OpContext& ctx,
                                                 std::function<absl::Status()> body) {
  DeviceGraph g;
  g.device_ = ctx.device;
  if (ctx.device == Device::kCpu) {
    g.body_ = std::move(body);
    return g;
  }
#if PD_WITH_CUDA
  if (ctx.stream == nullptr) {
    return absl::FailedPreconditionError("graph capture: the default stream cannot be captured");
  }
  PD_RETURN_IF_ERROR(cuda::GraphBeginCapture(ctx.stream));
  const absl::Status ran = body();
  absl::StatusOr<void*> exec = cuda::GraphEndCapture(ctx.stream);  // ends the capture always
  if (!ran.ok()) {
    if (exec.ok()) {
      cuda::GraphExecDestroy(*exec);
    }
    return ran;
  }
  if (!exec.ok()) {
    return exec.status();
  }
  g.exec_ = *exec;
  return g;
#else
  return NoCuda("graph capture");
#endif
}

DeviceGraph::DeviceGraph(DeviceGraph&& other) noexcept
    : device_(other.device_),
      exec_(std::exchange(other.exec_, nullptr)),
      body_(std::exchange(other.body_, nullptr)) {}

DeviceGraph& DeviceGraph::operator=(DeviceGraph&& other) noexcept {
  if (this != &other) {
    Release();
    device_ = other.device_;
    exec_ = std::exchange(other.exec_, nullptr);
    body_ = std::exchange(other.body_, nullptr);
  }
  return *this;
}

DeviceGraph::~DeviceGraph() { Release(); }

void DeviceGraph::Release() {
#if PD_WITH_CUDA
  if (device_ == Device::kCuda) {
    cuda::GraphExecDestroy(exec_);
  }
#endif
  exec_ = nullptr;
  body_ = nullptr;
}

absl::Status DeviceGraph::Launch(const OpContext& ctx) const {
  if (empty()) {
    return absl::FailedPreconditionError("graph launch: empty graph");
  }
  if (ctx.device != device_) {
    return absl::InvalidArgumentError("graph launch: a context of another device");
  }
  if (device_ == Device::kCpu) {
    return body_();
  }
#if PD_WITH_CUDA
  return cuda::GraphLaunch(exec_, ctx.stream);
#else
  return NoCuda("graph launch");
#endif
}

// --- events ---

absl::StatusOr<DeviceEvent> DeviceEvent::Create(Device device) {
  DeviceEvent e;
  e.device_ = device;
  if (device == Device::kCuda) {
#if PD_WITH_CUDA
    absl::StatusOr<void*> h = cuda::EventCreate();
    if (!h.ok()) {
      return h.status();
    }
    e.handle_ = *h;
#else
    return NoCuda("event");
#endif
  }
  return e;
}

DeviceEvent::DeviceEvent(DeviceEvent&& other) noexcept
    : device_(other.device_), handle_(std::exchange(other.handle_, nullptr)) {}

DeviceEvent& DeviceEvent::operator=(DeviceEvent&& other) noexcept {
  if (this != &other) {
    Release();
    device_ = other.device_;
    handle_ = std::exchange(other.handle_, nullptr);
  }
  return *this;
}

DeviceEvent::~DeviceEvent() { Release(); }

void DeviceEvent::Release() {
#if PD_WITH_CUDA
  if (device_ == Device::kCuda) {
    cuda::EventDestroy(handle_);
  }
#endif
  handle_ = nullptr;
}

absl::Status DeviceEvent::Record(const OpContext& ctx) {
  if (ctx.device != device_) {
    return absl::InvalidArgumentError("event: recorded on a stream of another device");
  }
  if (device_ == Device::kCpu) {
    return absl::OkStatus();
  }
#if PD_WITH_CUDA
  return cuda::EventRecord(handle_, ctx.stream);
#else
  return NoCuda("event");
#endif
}

absl::StatusOr<bool> DeviceEvent::Query() const {
  if (device_ == Device::kCpu) {
    return true;
  }
#if PD_WITH_CUDA
  return cuda::EventQuery(handle_);
#else
  return NoCuda("event");
#endif
}

absl::Status DeviceEvent::Synchronize() const {
  if (device_ == Device::kCpu) {
    return absl::OkStatus();
  }
#if PD_WITH_CUDA
  return cuda::EventSynchronize(handle_);
#else
  return NoCuda("event");
#endif
}

// --- page-locked host ranges ---

absl::StatusOr<HostRegistration> HostRegistration::Register(Device device, void* host,
                                                            int64_t bytes) {
  if (host == nullptr || bytes <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("host register: need a host range, got ", bytes, " bytes"));
  }
  HostRegistration r;
  r.device_ = device;
  if (device == Device::kCuda) {
#if PD_WITH_CUDA
    absl::Status s = cuda::HostRegister(host, bytes);
    if (!s.ok()) {
      return s;
    }
#else
    return NoCuda("host register");
#endif
  }
  r.host_ = host;
  return r;
}

HostRegistration::HostRegistration(HostRegistration&& other) noexcept
    : device_(other.device_), host_(std::exchange(other.host_, nullptr)) {}

HostRegistration& HostRegistration::operator=(HostRegistration&& other) noexcept {
  if (this != &other) {
    Release();
    device_ = other.device_;
    host_ = std::exchange(other.host_, nullptr);
  }
  return *this;
}

HostRegistration::~HostRegistration() { Release(); }

void HostRegistration::Release() {
#if PD_WITH_CUDA
  if (device_ == Device::kCuda) {
    cuda::HostUnregister(host_);
  }
#endif
  host_ = nullptr;
}

}  // namespace pd::kernels
