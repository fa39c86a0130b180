// Internals of the UCX backend shared by its sources (ucx_transport_impl.h lists them) and its
// tests: the wire format of the active messages, the region descriptor's backend blob, lane
// inspection, and RAII for ucp handles. Private to transport/ucx (it includes ucp.h; nothing
// outside this folder may include it).
#pragma once

#include <ucp/api/ucp.h>

#include <cstdint>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "transport/kv_transport.h"

namespace pd::transport::ucx_internal {

constexpr uint64_t kMaxFrameBytes = 16 << 20;

enum AmId : unsigned {
  kAmHello = 1,       // header Hello, REPLY flag
  kAmHelloReply = 2,  // header Hello
  kAmData = 3,        // header DataHeader, payload
  kAmEnd = 4,         // header DataHeader (runs unused)
  kAmCancel = 5,      // header DataHeader
  kAmStatus = 6,      // header StatusHeader, payload = message
  kAmRmaReq = 7,      // header DataHeader, payload = RunWire[]: grant these runs
  kAmRmaGrant = 8,    // header StatusHeader (code OK): the runs are held, put them
  kAmRmaDone = 9,     // header DataHeader: every put of seq is flushed
};

// Hello: payload = the sender's nothing; HelloReply: payload = receiver's worker address.
struct Hello {
  uint64_t instance = 0;
  uint64_t version = 0;
  uint64_t cookie = 0;
  uint64_t conn = 0;  // reply: the receiver's id of this connection (names it on the data ep)
};

struct DataHeader {
  uint64_t seq = 0;
  uint64_t tag = 0;
  uint64_t nonce = 0;
  uint64_t rconn = 0;  // the receiver's connection id (AMs on the data ep have no reply ep)
  uint32_t dst_first = 0;
  uint32_t num_blocks = 0;
};

struct RunWire {
  uint32_t dst_first = 0;
  uint32_t num_blocks = 0;
};

struct StatusHeader {
  uint64_t seq = 0;
  uint32_t code = 0;
  uint32_t pad = 0;
};

absl::Status UcsError(absl::string_view what, ucs_status_t s);

// ucp_ep_print_info's text (its lanes and the protocols chosen per operation).
std::string EpInfo(ucp_ep_h ep);

// The transport named on the lane carrying `role` in EpInfo text ("" if none), e.g.
// "cma/memory" for "lane[3]:  5:cma/memory.0 md[4] -> ... rma_bw#0".
std::string LaneTransport(absl::string_view info, absl::string_view role);

// Transports that move bulk data without a socket: shared memory, cma/knem/xpmem, RDMA, CUDA.
bool IsFastTransport(absl::string_view tl);

// Transports for which kAuto puts (put + flush) into any registered region: RMA (rc/dc) and
// CUDA IPC. Not tcp (put is 0.2 GiB/s vs ~5.8 for AM, docs/benchmarks.md). Not shm for
// ordinary memory (puts go through cma, 7.5-8.8 GiB/s at 2 MiB x 32 with a 10-15 ms tail on
// some first transfers); shm puts into UCX-allocated regions instead (IsSharedMemoryTransport).
bool IsGoodPutTransport(absl::string_view tl);

// Shared-memory transports: a put into memory the receiver allocated through UCX (a sysv/posix
// segment this process attaches when it unpacks the rkey) is a memcpy.
bool IsSharedMemoryTransport(absl::string_view tl);

// ---- Where UCX listens ---------------------------------------------------------------------
// UCX's tcp transport opens a listening socket on every network device in UCX_NET_DEVICES
// (default "all": eth0's address too), whatever address the ucp listener was given. So the
// transport restricts NET_DEVICES to the interface that owns listen_host.

// The network interface owning the numeric IPv4 address `host` (from getifaddrs; an alias
// label "eth0:1" gives "eth0"), "" for 0.0.0.0 (every interface: no restriction). An address
// in 127.0.0.0/8 that no interface names exactly belongs to the loopback interface.
// InvalidArgument when `host` is not numeric IPv4 or no interface of this host has it.
absl::StatusOr<std::string> InterfaceOwning(absl::string_view host);

// The value of `name` (without the UCX_ prefix, e.g. "NET_DEVICES") in ucp_config_print text
// ("UCX_NET_DEVICES=all" lines); "" when absent.
std::string PrintedConfigValue(absl::string_view printed, absl::string_view name);

// ucp_config_print's text of `config` (every UCP option with its effective value).
std::string PrintConfig(const ucp_config_t* config);

// The backend blob of a region descriptor: the region's base address, its packed rkey, its
// memory kind and whether it is a UCX allocation (AllocateHost).
std::string EncodeRegionBlob(uint64_t base, absl::string_view packed_rkey, MemoryKind kind,
                             bool mapped);
// Whether the blob names a device region (senders then always put).
bool DescriptorTargetsDevice(absl::string_view blob);
// Whether the blob names a UCX allocation (shm senders then put).
bool DescriptorIsMapped(absl::string_view blob);

// ---- RAII for ucp handles (all used on the progress thread only) ---------------------------
struct ContextDeleter {
  void operator()(ucp_context* c) const { ucp_cleanup(c); }
};
struct WorkerDeleter {
  void operator()(ucp_worker* w) const { ucp_worker_destroy(w); }
};
struct ListenerDeleter {
  void operator()(ucp_listener* l) const { ucp_listener_destroy(l); }
};
struct ConfigDeleter {
  void operator()(ucp_config_t* c) const { ucp_config_release(c); }
};
// Shared: host allocations made through the context (AllocateHost) may outlive the transport.
using UcpContext = std::shared_ptr<ucp_context>;
using UcpWorker = std::unique_ptr<ucp_worker, WorkerDeleter>;
using UcpListener = std::unique_ptr<ucp_listener, ListenerDeleter>;
using UcpConfig = std::unique_ptr<ucp_config_t, ConfigDeleter>;

// A registered memory region (ucp_mem_map) and its packed rkey.
class UcpMem {
 public:
  UcpMem(ucp_context_h ctx, ucp_mem_h memh) : ctx_(ctx), memh_(memh) {}
  UcpMem(const UcpMem&) = delete;
  UcpMem& operator=(const UcpMem&) = delete;
  ~UcpMem() { ucp_mem_unmap(ctx_, memh_); }
  ucp_mem_h get() const { return memh_; }

 private:
  ucp_context_h ctx_;
  ucp_mem_h memh_;
};

// Host memory allocated by ucp_mem_map(ALLOCATE) and the registry the transport looks it up
// in when the memory is registered. The context is created thread-safe (mt_workers_shared), so
// mapping and unmapping may run on any thread.
struct UcxAllocations {
  struct Entry {
    uint64_t size = 0;
    ucp_mem_h memh = nullptr;
  };
  UcpContext context;
  absl::Mutex mu;
  absl::flat_hash_map<uintptr_t, Entry> by_base ABSL_GUARDED_BY(mu);

  // The allocation containing [base, base + size), if any.
  const Entry* Find(const void* base, uint64_t size) ABSL_SHARED_LOCKS_REQUIRED(mu) {
    const auto b = reinterpret_cast<uintptr_t>(base);
    for (const auto& [start, e] : by_base) {
      if (b >= start && b + size <= start + e.size) {
        return &e;
      }
    }
    return nullptr;
  }
};

class UcxHostAllocation : public HostAllocation {
 public:
  UcxHostAllocation(std::shared_ptr<UcxAllocations> registry, void* data, uint64_t size,
                    ucp_mem_h memh)
      : registry_(std::move(registry)), data_(data), size_(size), memh_(memh) {}
  ~UcxHostAllocation() override {
    {
      absl::MutexLock lock(&registry_->mu);
      registry_->by_base.erase(reinterpret_cast<uintptr_t>(data_));
    }
    ucp_mem_unmap(registry_->context.get(), memh_);
  }
  void* data() const override { return data_; }
  uint64_t size() const override { return size_; }
  std::string Describe() const override { return "ucx ucp_mem_map allocation"; }

 private:
  std::shared_ptr<UcxAllocations> registry_;
  void* const data_;
  const uint64_t size_;
  ucp_mem_h const memh_;
};

// An endpoint; closed (force: peers may be dead) and progressed until released.
class UcpEndpoint {
 public:
  UcpEndpoint(ucp_worker_h w, ucp_ep_h ep) : worker_(w), ep_(ep) {}
  UcpEndpoint(const UcpEndpoint&) = delete;
  UcpEndpoint& operator=(const UcpEndpoint&) = delete;
  ~UcpEndpoint() {
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    p.flags = UCP_EP_CLOSE_FLAG_FORCE;
    ucs_status_ptr_t req = ucp_ep_close_nbx(ep_, &p);
    if (UCS_PTR_IS_PTR(req)) {
      while (ucp_request_check_status(req) == UCS_INPROGRESS) {
        ucp_worker_progress(worker_);
      }
      ucp_request_free(req);
    }
  }
  ucp_ep_h get() const { return ep_; }

 private:
  ucp_worker_h worker_;
  ucp_ep_h ep_;
};

}  // namespace pd::transport::ucx_internal
