// The UCX backend's transport class and its per-connection state, shared by the sources that
// implement it. Private to transport/ucx (it includes ucp.h through ucx_internal.h: nothing
// outside this folder may include it).
//
// One ucp worker driven by one progress thread: every UCX call happens on that thread (API
// calls enqueue closures and signal the worker), so UCX runs in single-thread mode and no UCX
// handle is shared. The thread sleeps on the worker's event fd when idle (ucp_worker_arm +
// poll) instead of burning a core.
//
// Endpoints. Each connection has a control endpoint made from the socket address with
// UCP_ERR_HANDLING_MODE_PEER (it detects a dead peer and carries the handshake, grants and
// statuses). UCX 1.13 drops every transport without peer-failure support from such an endpoint
// (sysv/posix unless UCX_*_ERROR_HANDLING=y, and cma in practice), so on one host it runs over
// tcp loopback only. The receiver therefore also sends its worker address in the handshake and
// the sender opens a data endpoint to it (UCP_ERR_HANDLING_MODE_NONE: sysv/posix AM lanes and
// cma/rdma rma_bw lanes); it is kept only when UCX picked such a lane for it, and peer failure
// is still detected on the control endpoint, which force-closes the data endpoint.
//
// Data paths (chosen per connection, see UcxDataPath, and per destination region: device
// regions and, over shared-memory lanes, regions the receiver allocated with AllocateHost are
// always written by RMA):
//  * Active messages. Each coalesced run is one ucp_am_send_nbx whose header names (seq, tag,
//    nonce, dst run); the receiver validates the run against its expectation before it accepts
//    any byte, then receives eager data by memcpy or rendezvous data with ucp_am_recv_data_nbx
//    straight into the destination blocks (UCX pulls with get_zcopy over cma/rdma). END follows
//    on the same endpoint and is acknowledged once every run landed.
//  * RMA. The sender asks for a grant (RMA_REQ with the runs) on the control endpoint; the
//    receiver validates every run (live registration, nonce, announced blocks) and holds them
//    as in-progress writes, so Cancel/Deregister wait for the writer; on GRANT the sender
//    ucp_put_nbx-es each run at the descriptor's base + offset with its unpacked rkey, flushes
//    the data endpoint, then sends RMA_DONE; the receiver completes the expectation and
//    answers with a status. A stale or foreign descriptor is refused before any byte moves.
//
// The class is split by job:
//   ucx_transport.cc    the transport object: creation, the progress thread and its command
//                       queue, shutdown, and the transfer API (PostTransfer, Cancel)
//   ucx_connections.cc  the listener, accepting and dialing (Connect, the HELLO handshake),
//                       the data endpoint and data-path choice, peer failure
//   ucx_am_path.cc      active messages: sending them, the dispatch of every received one,
//                       the AM data path of both sides, statuses and cancels
//   ucx_rma_path.cc     the RMA data path: grant requests, held runs, puts, flush, RMA_DONE
//   ucx_memory.cc       Register / Deregister (ucp_mem_map, rkeys) and AllocateHost
//   ucx_internal.{h,cc} wire structs, lane inspection, the region blob, RAII for ucp handles
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "transport/internal/transport_core.h"
#include "transport/kv_transport.h"
#include "transport/ucx/ucx_internal.h"
#include "transport/ucx/ucx_transport.h"

namespace pd::transport::ucx_internal {

class UcxTransport;

// Per-connection state. Client side: a Peer (we send data); server side: an inbound
// connection (we receive). Both are keyed by a small id used as the core's `source`.
// Progress thread only.
struct UcxConn {
  UcxConn() = default;
  UcxConn(const UcxConn&) = delete;
  UcxConn& operator=(const UcxConn&) = delete;
  ~UcxConn() {
    for (auto& [nonce, rkey] : rkeys) {
      ucp_rkey_destroy(rkey);
    }
    data_ep.reset();
    ep.reset();
  }
  // The endpoint bulk data goes over: the data endpoint when there is one.
  ucp_ep_h data() const { return data_ep != nullptr ? data_ep->get() : ep->get(); }

  uint64_t id = 0;
  uint64_t peer_instance = 0;
  uint64_t remote_conn = 0;  // client: the receiver's id of this connection
  std::unique_ptr<UcpEndpoint> ep;
  std::unique_ptr<UcpEndpoint> data_ep;  // client: shm/cma/rdma endpoint (null: use ep)
  bool rma = false;                      // client: data moves by put + flush
  // client: puts into a receiver's transport-allocated memory (a shared segment) go over
  // this connection's shm lanes as one memcpy, so kAuto uses RMA for such regions.
  bool mapped_rma = false;
  std::string data_lanes;  // client: "am=<tl> rma=<tl>" of the data endpoint
  bool dead = false;
  bool client = false;
  struct InFlight {
    DataHeader h;
    bool rma = false;  // moves by put + flush (else AM frames on the data endpoint)
  };
  absl::flat_hash_map<uint64_t, InFlight> in_flight;  // client: seq -> ids, awaiting status
  absl::flat_hash_map<uint64_t, ucp_rkey_h> rkeys;    // client: unpacked, by region nonce
  UcxTransport* owner = nullptr;
};

// Sender state of an RMA transfer between RMA_REQ and the flush of its puts.
struct RmaPost {
  uint64_t conn = 0;
  transport_internal::PreparedPost post;
  int outstanding = 0;  // puts + flush not yet completed
  bool started = false;
  absl::Status error;
};

// A receive in progress for (conn, seq): END is answered once `outstanding` drops to 0.
struct SeqState {
  int outstanding = 0;
  bool end_pending = false;
  bool failed = false;
  DataHeader end;
};

// A rendezvous receive in flight (ucx_am_path.cc).
struct RecvCtx;

// The UCX KvTransport (ucx_transport.h). Thread-safe: API methods run their UCX work on the
// progress thread (Run/RunSync); the "progress thread" members below are touched only there,
// mu_ guards what API threads share with it.
class UcxTransport : public transport_internal::CoreBackedTransport {
 public:
  static absl::StatusOr<std::unique_ptr<KvTransport>> Create(const UcxTransportOptions& o);
  ~UcxTransport() override;

  TransportCaps Caps() const override {
    TransportCaps c;
    c.host_memory = true;
    c.cuda_memory = cuda_memory_;
    c.one_sided = options_.data_path != UcxDataPath::kActiveMessage;
    c.two_sided = options_.data_path != UcxDataPath::kRma;
    c.notifications = true;
    c.cancel = true;
    c.fast_host_allocation = true;
    return c;
  }
  absl::StatusOr<RegionHandle> Register(const MemoryRegion& region) override;
  absl::Status Deregister(RegionHandle region) override;
  absl::StatusOr<std::unique_ptr<HostAllocation>> AllocateHost(uint64_t bytes) override;
  absl::StatusOr<PeerHandle> Connect(absl::string_view endpoint) override;
  absl::StatusOr<TransferId> PostTransfer(PeerHandle peer, uint64_t tag, RegionHandle src,
                                          absl::Span<const BlockPair> pairs,
                                          absl::string_view remote_descriptor,
                                          const TransferOptions& options) override;
  absl::Status Cancel(TransferId id) override;

  // ---- progress-thread callbacks (called from UCX's C callbacks)
  void OnConnRequest(ucp_conn_request_h req);
  void OnEpError(UcxConn* conn, ucs_status_t status);
  ucs_status_t OnAm(unsigned id, const void* header, size_t header_length, void* data,
                    size_t length, const ucp_am_recv_param_t* param);
  void OnRecvDone(RecvCtx* ctx, ucs_status_t status);
  void OnSendDone(uint64_t seq, ucs_status_t status);
  void OnRmaOpDone(uint64_t seq, ucs_status_t status);

  // Request contexts handed to UCX (a send's, a receive's, a put's) are kept here until their
  // request completes. One UCX never completes (a rendezvous send whose peer died before it
  // answered is not always purged by a forced close) stays here, and the destructor frees it
  // once the worker is gone.
  template <typename Ctx>
  Ctx* Track(Ctx* ctx) {
    in_flight_.emplace(ctx, [](const void* p) { delete static_cast<const Ctx*>(p); });
    return ctx;
  }
  // The context's request completed (or never started): no longer kept here.
  void Forget(const void* ctx) { in_flight_.erase(ctx); }
  template <typename Ctx>
  void Release(Ctx* ctx) {
    Forget(ctx);
    delete ctx;
  }

 private:
  struct HelloReply {
    Hello hello;
    std::string worker_address;
  };

  explicit UcxTransport(UcxTransportOptions o)
      : CoreBackedTransport("ucx"), options_(std::move(o)) {}

  // ---- ucx_transport.cc: lifecycle, progress thread, posting
  absl::Status Init();
  // Restricts UCX_NET_DEVICES to the interface of options_.listen_host (unless chosen
  // explicitly or the host is 0.0.0.0). InvalidArgument when no interface has that address.
  absl::Status RestrictNetworkDevices(ucp_config_t* config);
  void Loop();
  // Shutdown, on the progress thread: fails what is pending, closes endpoints.
  void CloseAll();
  // Runs `fn` on the progress thread; RunSync waits for it.
  void Run(std::function<void()> fn);
  void RunSync(std::function<void()> fn);
  // Sender: picks the data path of one post and hands it to StartRmaPost or StartAmPost.
  void StartPost(uint64_t conn_id, transport_internal::PreparedPost post);

  // ---- ucx_connections.cc
  // Creates the listener on options_.listen_host:listen_port and sets address_.
  absl::Status Listen();
  UcxConn* FindConn(uint64_t id);
  // Receiver: a HELLO on an accepted connection; client: the receiver's HELLO_REPLY.
  void OnHello(uint64_t conn_id, const void* header, size_t header_length);
  void OnHelloReply(const void* header, size_t header_length, const void* data, size_t length,
                    bool rndv);
  // Client: waits up to connect_timeout for the HELLO_REPLY to `cookie` on `conn_id`;
  // Unavailable (and the connection marked dead) when none came.
  absl::StatusOr<HelloReply> AwaitHelloReply(uint64_t cookie, uint64_t conn_id,
                                             absl::string_view address);
  // Client: opens the data endpoint to the receiver's worker address and picks the data path.
  void SetupDataPath(UcxConn& conn, const std::string& worker_address);

  // ---- ucx_am_path.cc
  absl::Status RegisterAmHandlers();
  void SendAm(UcxConn& conn, unsigned id, const void* header, size_t header_len, const void* data,
              size_t len, uint64_t seq, bool on_data_ep = false, std::string payload = "");
  void SendStatus(uint64_t conn_id, uint64_t seq, const absl::Status& s);
  // Sender: a status answering one of our posts (either path).
  void OnStatus(const void* header, size_t header_length, const void* data, size_t length,
                bool rndv);
  // Receiver: the sender gave up on `h.seq`.
  void OnCancel(uint64_t conn_id, const DataHeader& h);
  // Receiver: one AM data frame; UCS_INPROGRESS when it keeps rendezvous `data`.
  ucs_status_t OnData(uint64_t conn_id, const DataHeader& h, void* data, size_t length, bool rndv);
  // Receiver: answers END once every run of the sequence landed.
  void SeqProgress(uint64_t conn_id, uint64_t seq);
  // Sender: the post's runs as AM data frames, then END, on the data endpoint.
  void StartAmPost(UcxConn& conn, DataHeader h, const transport_internal::PreparedPost& post);

  // ---- ucx_rma_path.cc
  // Sender: asks the receiver to hold the post's runs; OnRmaGrant puts them.
  void StartRmaPost(UcxConn& conn, const DataHeader& h, transport_internal::PreparedPost post);
  void OnRmaGrant(uint64_t seq);
  // Sender: the put of every run, then the flush, for a granted post.
  void IssuePuts(UcxConn& conn, uint64_t seq, RmaPost& rp);
  void FinishRmaPost(uint64_t seq);
  // Receiver: RMA_REQ / RMA_DONE / release of held runs.
  void OnRmaReq(uint64_t conn_id, const DataHeader& h, const void* data, size_t length, bool rndv);
  void OnRmaDone(uint64_t conn_id, const DataHeader& h);
  void ReleaseGrants(uint64_t conn_id, uint64_t seq, bool ok, const absl::Status& why);

  const UcxTransportOptions options_;

  // Progress-thread-only state.
  UcpContext context_;
  UcpWorker worker_;
  UcpListener listener_;
  int efd_ = -1;
  // The UCX context supports UCS_MEMORY_TYPE_CUDA (ucp_context_query): a UCX built with
  // cuda_copy/cuda_ipc (Debian's is not). Set once in Create.
  bool cuda_memory_ = false;
  uint64_t next_conn_ = 1;
  absl::flat_hash_map<uint64_t, std::unique_ptr<UcxConn>> conns_;
  absl::flat_hash_map<std::pair<uint64_t, uint64_t>, SeqState> seqs_;  // (conn, seq)
  // By region handle; null for a region inside an allocation (allocations_ owns its memh).
  absl::flat_hash_map<uint64_t, std::unique_ptr<UcpMem>> mems_;
  std::shared_ptr<UcxAllocations> allocations_;
  std::vector<std::unique_ptr<UcxConn>> graveyard_;   // failed conns, closed by the loop
  absl::flat_hash_map<const void*, void (*)(const void*)> in_flight_;  // request contexts (Track)
  std::string worker_address_;                        // ucp_worker_get_address bytes
  absl::flat_hash_map<uint64_t, RmaPost> rma_posts_;  // sender, by seq
  // Receiver: runs held for an RMA writer, by (conn, seq).
  absl::flat_hash_map<std::pair<uint64_t, uint64_t>, std::vector<transport_internal::WriteGrant>>
      grants_;

  // Shared with API threads.
  absl::Mutex mu_;
  std::deque<std::function<void()>> commands_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  absl::flat_hash_map<uint64_t, HelloReply> hello_replies_ ABSL_GUARDED_BY(mu_);  // by cookie
  absl::flat_hash_map<uint32_t, uint64_t> peer_conn_ ABSL_GUARDED_BY(mu_);        // handle -> conn
  absl::flat_hash_map<uint64_t, uint64_t> conn_instance_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, bool> conn_dead_ ABSL_GUARDED_BY(mu_);
  uint32_t next_peer_ ABSL_GUARDED_BY(mu_) = 1;
  std::thread thread_;
};

}  // namespace pd::transport::ucx_internal
