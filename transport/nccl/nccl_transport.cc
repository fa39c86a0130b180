// NcclTransport, the object: its shutdown, registration of device pools (and the pins that
// keep a source pool registered while a send reads it), Cancel, and the factory. The socket
// control plane is in nccl_control_plane.cc, the NCCL data plane in nccl_data_plane.cc; the
// class and its connection state are declared in nccl_transport_impl.h.
#include "transport/nccl/nccl_transport.h"

#include <cuda_runtime.h>
#include <unistd.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/base/status_macros.h"
#include "transport/internal/socket_util.h"
#include "transport/internal/transport_core.h"
#include "transport/nccl/nccl_transport_impl.h"

namespace pd::transport {
namespace nccl_internal {

NcclTransport::~NcclTransport() {
  std::vector<std::shared_ptr<Conn>> conns;
  {
    absl::MutexLock lock(&mu_);
    stopping_.store(true);
    for (auto& [id, c] : conns_) {
      conns.push_back(c);
    }
  }
  for (auto& c : conns) {
    AbortConn(*c, absl::UnavailableError("nccl transport shutting down"));
  }
  acceptor_.join();
  WakeProgress();
  progress_.join();  // retires every op (aborted groups end) and reaps every connection
  for (auto& c : conns) {
    if (c->reader.joinable()) {
      c->reader.join();
    }
  }
  ::close(listen_fd_);
}

void NcclTransport::WakeProgress() {
  absl::MutexLock lock(&mu_);
  work_ = true;
}

void NcclTransport::Unpin(uint64_t region) {
  absl::MutexLock lock(&mu_);
  auto it = pins_.find(region);
  if (it != pins_.end() && --it->second == 0) {
    pins_.erase(it);
  }
}

void NcclTransport::AddConn(const std::shared_ptr<Conn>& conn) { conns_[conn->id] = conn; }

absl::StatusOr<RegionHandle> NcclTransport::Register(const MemoryRegion& region) {
  if (region.base == nullptr) {
    return absl::InvalidArgumentError("register: null base");
  }
  if (region.kind != MemoryKind::kCuda) {
    return absl::UnimplementedError(
        "nccl transport moves device memory only (MemoryKind::kCuda); register host pools "
        "with the tcp or ucx transport");
  }
  if (region.device != options_.device) {
    return absl::InvalidArgumentError(absl::StrCat("register: region on cuda device ",
                                                   region.device, " but this nccl transport ",
                                                   "serves device ", options_.device));
  }
  // Both ends of the region must be device memory of our device (a host pointer given as
  // kCuda would make NCCL fault on the GPU instead of failing here).
  const char* ends[] = {
      static_cast<const char*>(region.base),
      static_cast<const char*>(region.base) + (region.size_bytes > 0 ? region.size_bytes - 1 : 0)};
  for (const char* p : ends) {
    cudaPointerAttributes attr{};
    const cudaError_t e = cudaPointerGetAttributes(&attr, p);
    if (e != cudaSuccess) {
      cudaGetLastError();  // clear the non-sticky error
      return absl::InvalidArgumentError(CudaError("register: cudaPointerGetAttributes", e));
    }
    if ((attr.type != cudaMemoryTypeDevice && attr.type != cudaMemoryTypeManaged) ||
        attr.device != options_.device) {
      return absl::InvalidArgumentError(
          absl::StrCat("register: ", region.size_bytes, " bytes at 0x",
                       absl::Hex(reinterpret_cast<uintptr_t>(region.base)),
                       " are not device memory of cuda device ", options_.device));
    }
  }
  return core_.AddRegion(region, /*allow_cuda=*/true);
}

absl::Status NcclTransport::Deregister(RegionHandle region) {
  absl::StatusOr<transport_internal::RegionInfo> info = core_.RemoveRegion(region);
  if (!info.ok()) {
    return info.status();
  }
  // No new post can pin it now (PreparePost fails); wait for the ones that did. Every pinned
  // transfer retires by its timeout at the latest (its connection is aborted then).
  const uint64_t h = region.value();
  absl::MutexLock lock(&mu_);
  auto unpinned = [this, h]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !pins_.contains(h); };
  mu_.Await(absl::Condition(&unpinned));
  return absl::OkStatus();
}

absl::Status NcclTransport::Cancel(TransferId id) {
  bool posted = false;
  {
    absl::MutexLock lock(&mu_);
    posted = posted_.contains(id.value());
  }
  if (posted) {
    absl::StatusOr<TransferState> st = core_.Poll(id);
    if (st.ok() && st->finished()) {
      return absl::OkStatus();  // no effect on a finished transfer (its group may still retire)
    }
    return absl::UnimplementedError(absl::StrCat(
        "nccl transport cannot cancel posted transfer ", id.value(),
        ": NCCL has no per-operation cancel; it ends at its timeout (the connection is "
        "aborted then if the send was issued)"));
  }
  // Expectations (and finished transfers: no effect). An expectation whose receive group is
  // in flight stops when the progress thread aborts that connection.
  return core_.Cancel(id).status();
}

}  // namespace nccl_internal

int NcclUsableDeviceCount() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;  // no driver (cudaErrorInsufficientDriver) or no device
  }
  return n;
}

absl::StatusOr<std::unique_ptr<KvTransport>> CreateNcclTransport(
    const NcclTransportOptions& options) {
  const int devices = NcclUsableDeviceCount();
  if (devices == 0) {
    return absl::FailedPreconditionError("nccl transport: no usable CUDA device");
  }
  if (options.device < 0 || options.device >= devices) {
    return absl::InvalidArgumentError(absl::StrCat("nccl transport: cuda device ", options.device,
                                                   " out of range [0, ", devices, ")"));
  }
  if (options.connect_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("nccl transport: connect_timeout must be positive");
  }
  PD_ASSIGN_OR_RETURN(
      transport_internal::ListeningSocket listener,
      transport_internal::ListenTcp(options.listen_host, options.listen_port, "nccl"));
  return std::unique_ptr<KvTransport>(
      new nccl_internal::NcclTransport(options, listener.fd, std::move(listener.address)));
}

}  // namespace pd::transport
