// UcxTransport's memory: Register maps a region with ucp_mem_map (or reuses the mapping of an
// AllocateHost allocation, whose rkey lets a peer on this host attach the shared segment) and
// packs its rkey into the descriptor blob; Deregister unmaps it once the core released it;
// AllocateHost hands out ucp_mem_map(ALLOCATE) memory that the transport later recognises.
// See ucx_transport_impl.h.
#include <ucp/api/ucp.h>

#include <cstring>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/base/status_macros.h"
#include "transport/internal/transport_core.h"
#include "transport/ucx/ucx_internal.h"
#include "transport/ucx/ucx_transport_impl.h"

namespace pd::transport::ucx_internal {

absl::StatusOr<RegionHandle> UcxTransport::Register(const MemoryRegion& region) {
  // Validate first (no UCX work for bad input), then map and pack the rkey on the loop.
  if (region.base == nullptr || region.size_bytes == 0) {
    return absl::InvalidArgumentError("register: null base or zero size");
  }
  const bool cuda = region.kind == MemoryKind::kCuda;
  if (cuda && !cuda_memory_) {
    return absl::UnimplementedError(
        "this UCX build has no CUDA memory support (ucp_context_query reports no "
        "UCS_MEMORY_TYPE_CUDA); install UCX with cuda_copy/cuda_ipc, or use the nccl transport");
  }
  // Memory from AllocateHost is mapped already: its memh's rkey lets a peer on this host attach
  // the segment (a put is then a memcpy), which a second ucp_mem_map of the range would lose.
  ucp_mem_h allocated = nullptr;
  if (!cuda) {
    absl::ReaderMutexLock lock(&allocations_->mu);
    if (const UcxAllocations::Entry* e = allocations_->Find(region.base, region.size_bytes)) {
      allocated = e->memh;
    }
  }
  ucp_mem_h memh = allocated;
  std::string blob;
  ucs_status_t status = UCS_OK;
  RunSync([&] {
    if (memh == nullptr) {
      ucp_mem_map_params_t mp{};
      mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
      mp.address = region.base;
      mp.length = region.size_bytes;
      if (cuda) {
        mp.field_mask |= UCP_MEM_MAP_PARAM_FIELD_MEMORY_TYPE;
        mp.memory_type = UCS_MEMORY_TYPE_CUDA;
      }
      status = ucp_mem_map(context_.get(), &mp, &memh);
      if (status != UCS_OK) {
        return;
      }
    }
    void* rkey = nullptr;
    size_t rkey_len = 0;
    if (ucp_rkey_pack(context_.get(), memh, &rkey, &rkey_len) == UCS_OK) {
      blob = EncodeRegionBlob(reinterpret_cast<uintptr_t>(region.base),
                              absl::string_view(static_cast<const char*>(rkey), rkey_len),
                              region.kind, allocated != nullptr);
      ucp_rkey_buffer_release(rkey);
    }
  });
  if (status != UCS_OK) {
    return UcsError("ucp_mem_map", status);
  }
  absl::StatusOr<RegionHandle> h = core_.AddRegion(region, /*allow_cuda=*/cuda_memory_, blob);
  std::unique_ptr<UcpMem> mem;
  if (allocated == nullptr) {
    mem = std::make_unique<UcpMem>(context_.get(), memh);
  }
  if (!h.ok()) {
    RunSync([&] { mem.reset(); });
    return h;
  }
  RunSync([&] { mems_[h->value()] = std::move(mem); });
  return h;
}

absl::StatusOr<std::unique_ptr<HostAllocation>> UcxTransport::AllocateHost(uint64_t bytes) {
  if (bytes == 0) {
    return absl::InvalidArgumentError("allocate host memory: 0 bytes");
  }
  ucp_mem_map_params_t mp{};
  mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH |
                  UCP_MEM_MAP_PARAM_FIELD_FLAGS;
  mp.address = nullptr;
  mp.length = bytes;
  mp.flags = UCP_MEM_MAP_ALLOCATE;
  ucp_mem_h memh = nullptr;
  const ucs_status_t st = ucp_mem_map(context_.get(), &mp, &memh);
  if (st != UCS_OK) {
    return absl::ResourceExhaustedError(
        absl::StrCat("allocate host memory: ucp_mem_map(ALLOCATE) of ", bytes,
                     " bytes: ", ucs_status_string(st)));
  }
  ucp_mem_attr_t attr{};
  attr.field_mask = UCP_MEM_ATTR_FIELD_ADDRESS | UCP_MEM_ATTR_FIELD_LENGTH;
  if (ucp_mem_query(memh, &attr) != UCS_OK || attr.address == nullptr || attr.length < bytes) {
    ucp_mem_unmap(context_.get(), memh);
    return absl::InternalError("allocate host memory: ucp_mem_query gave no address");
  }
  // Fresh shared segments read as zeros, but UCX may fall back to heap memory: zero it (this
  // also faults the pages in now rather than under the first transfers).
  std::memset(attr.address, 0, bytes);
  {
    absl::MutexLock lock(&allocations_->mu);
    allocations_->by_base[reinterpret_cast<uintptr_t>(attr.address)] =
        UcxAllocations::Entry{attr.length, memh};
  }
  return std::unique_ptr<HostAllocation>(
      new UcxHostAllocation(allocations_, attr.address, bytes, memh));
}

absl::Status UcxTransport::Deregister(RegionHandle region) {
  PD_RETURN_IF_ERROR(core_.RemoveRegion(region).status());
  RunSync([&] { mems_.erase(region.value()); });  // a null entry (allocation) unmaps nothing
  return absl::OkStatus();
}

}  // namespace pd::transport::ucx_internal
