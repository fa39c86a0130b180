// UCX backend. One ucp worker driven by one progress thread: every UCX call happens on that
// thread (API calls enqueue closures and signal the worker), so UCX runs in single-thread mode
// and no UCX handle is shared. The thread sleeps on the worker's event fd when idle
// (ucp_worker_arm + poll) instead of burning a core.
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
#include "transport/ucx/ucx_transport.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <ucp/api/ucp.h>

#include <cstring>
#include <deque>
#include <functional>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "common/base/status_macros.h"
#include "common/log/log.h"
#include "transport/internal/byte_codec.h"
#include "transport/internal/transport_core.h"
#include "transport/ucx/ucx_internal.h"

namespace pd::transport {
namespace {

using transport_internal::PreparedPost;
using transport_internal::TransportCore;
using transport_internal::WriteGrant;

using ucx_internal::ConfigDeleter;
using ucx_internal::ContextDeleter;
using ucx_internal::DataHeader;
using ucx_internal::DescriptorIsMapped;
using ucx_internal::DescriptorTargetsDevice;
using ucx_internal::EncodeRegionBlob;
using ucx_internal::EpInfo;
using ucx_internal::Hello;
using ucx_internal::IsFastTransport;
using ucx_internal::IsGoodPutTransport;
using ucx_internal::IsSharedMemoryTransport;
using ucx_internal::kMaxFrameBytes;
using ucx_internal::LaneTransport;
using ucx_internal::RunWire;
using ucx_internal::StatusHeader;
using ucx_internal::UcpConfig;
using ucx_internal::UcpContext;
using ucx_internal::UcpEndpoint;
using ucx_internal::UcpListener;
using ucx_internal::UcpMem;
using ucx_internal::UcpWorker;
using ucx_internal::UcsError;
using ucx_internal::UcxAllocations;
using ucx_internal::UcxHostAllocation;
using ucx_internal::kAmHello;
using ucx_internal::kAmHelloReply;
using ucx_internal::kAmData;
using ucx_internal::kAmEnd;
using ucx_internal::kAmCancel;
using ucx_internal::kAmStatus;
using ucx_internal::kAmRmaReq;
using ucx_internal::kAmRmaGrant;
using ucx_internal::kAmRmaDone;

class UcxTransport;

// Per-connection state. Client side: a Peer (we send data); server side: an inbound
// connection (we receive). Both are keyed by a small id used as the core's `source`.
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
  std::string data_lanes;                // client: "am=<tl> rma=<tl>" of the data endpoint
  bool dead = false;
  bool client = false;
  struct InFlight {
    DataHeader h;
    bool rma = false;  // moves by put + flush (else AM frames on the data endpoint)
  };
  absl::flat_hash_map<uint64_t, InFlight> in_flight;  // client: seq -> ids, awaiting status
  absl::flat_hash_map<uint64_t, ucp_rkey_h> rkeys;      // client: unpacked, by region nonce
  UcxTransport* owner = nullptr;
};

// Sender state of an RMA transfer between RMA_REQ and the flush of its puts.
struct RmaPost {
  uint64_t conn = 0;
  PreparedPost post;
  int outstanding = 0;  // puts + flush not yet completed
  bool started = false;
  absl::Status error;
};

struct RmaOpCtx {
  UcxTransport* t;
  uint64_t seq;
};

// A receive in progress for (conn, seq): END is answered once `outstanding` drops to 0.
struct SeqState {
  int outstanding = 0;
  bool end_pending = false;
  bool failed = false;
  DataHeader end;
};

struct RecvCtx {
  UcxTransport* t;
  WriteGrant grant;
  uint64_t conn;
  uint64_t seq;
};

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

  // ---- progress-thread callbacks
  void OnConnRequest(ucp_conn_request_h req);
  void OnEpError(UcxConn* conn, ucs_status_t status);
  ucs_status_t OnAm(unsigned id, const void* header, size_t header_length, void* data,
                    size_t length, const ucp_am_recv_param_t* param);
  void OnRecvDone(RecvCtx* ctx, ucs_status_t status);
  void OnSendDone(uint64_t seq, ucs_status_t status);
  void OnRmaOpDone(uint64_t seq, ucs_status_t status);

 private:
  explicit UcxTransport(UcxTransportOptions o)
      : CoreBackedTransport("ucx"), options_(std::move(o)) {}
  absl::Status Init();
  void Loop();
  // Runs `fn` on the progress thread; RunSync waits for it.
  void Run(std::function<void()> fn);
  void RunSync(std::function<void()> fn);
  void SendAm(UcxConn& conn, unsigned id, const void* header, size_t header_len, const void* data,
              size_t len, uint64_t seq, bool on_data_ep = false, std::string payload = "");
  void SendStatus(uint64_t conn_id, uint64_t seq, const absl::Status& s);
  void StartPost(uint64_t conn_id, PreparedPost post);
  void SeqProgress(uint64_t conn_id, uint64_t seq);
  UcxConn* FindConn(uint64_t id);
  // Client: opens the data endpoint to the receiver's worker address and picks the data path.
  void SetupDataPath(UcxConn& conn, const std::string& worker_address);
  void OnRmaGrant(uint64_t seq);
  void FinishRmaPost(uint64_t seq);
  // Receiver: RMA_REQ / RMA_DONE / release of held runs.
  void OnRmaReq(uint64_t conn_id, const DataHeader& h, const void* data, size_t length, bool rndv);
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
  std::string worker_address_;                        // ucp_worker_get_address bytes
  absl::flat_hash_map<uint64_t, RmaPost> rma_posts_;  // sender, by seq
  // Receiver: runs held for an RMA writer, by (conn, seq).
  absl::flat_hash_map<std::pair<uint64_t, uint64_t>, std::vector<WriteGrant>> grants_;

  // Shared with API threads.
  absl::Mutex mu_;
  std::deque<std::function<void()>> commands_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  struct HelloReply {
    Hello hello;
    std::string worker_address;
  };
  absl::flat_hash_map<uint64_t, HelloReply> hello_replies_ ABSL_GUARDED_BY(mu_);  // by cookie
  absl::flat_hash_map<uint32_t, uint64_t> peer_conn_ ABSL_GUARDED_BY(mu_);        // handle -> conn
  absl::flat_hash_map<uint64_t, uint64_t> conn_instance_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, bool> conn_dead_ ABSL_GUARDED_BY(mu_);
  uint32_t next_peer_ ABSL_GUARDED_BY(mu_) = 1;
  std::thread thread_;
};

// ---- C callbacks -----------------------------------------------------------------------------
void ConnHandler(ucp_conn_request_h req, void* arg) {
  static_cast<UcxTransport*>(arg)->OnConnRequest(req);
}
void EpErrorHandler(void* arg, ucp_ep_h, ucs_status_t status) {
  auto* conn = static_cast<UcxConn*>(arg);
  conn->owner->OnEpError(conn, status);
}
template <unsigned kId>
ucs_status_t AmHandler(void* arg, const void* header, size_t header_length, void* data,
                       size_t length, const ucp_am_recv_param_t* param) {
  return static_cast<UcxTransport*>(arg)->OnAm(kId, header, header_length, data, length, param);
}
void RecvCallback(void* request, ucs_status_t status, size_t, void* user_data) {
  auto* ctx = static_cast<RecvCtx*>(user_data);
  ctx->t->OnRecvDone(ctx, status);
  ucp_request_free(request);
}
struct SendCtx {
  UcxTransport* t;
  uint64_t seq;
  std::string owned;    // keeps small headers/messages alive until completion
  std::string payload;  // keeps a small payload alive until completion
};
void RmaOpCallback(void* request, ucs_status_t status, void* user_data) {
  auto* ctx = static_cast<RmaOpCtx*>(user_data);
  ctx->t->OnRmaOpDone(ctx->seq, status);
  delete ctx;
  ucp_request_free(request);
}
void SendCallback(void* request, ucs_status_t status, void* user_data) {
  auto* ctx = static_cast<SendCtx*>(user_data);
  ctx->t->OnSendDone(ctx->seq, status);
  delete ctx;
  ucp_request_free(request);
}

absl::StatusOr<std::unique_ptr<KvTransport>> UcxTransport::Create(const UcxTransportOptions& o) {
  std::unique_ptr<UcxTransport> t(new UcxTransport(o));
  PD_RETURN_IF_ERROR(t->Init());
  return std::unique_ptr<KvTransport>(std::move(t));
}

absl::Status UcxTransport::Init() {
  ucp_config_t* raw_config = nullptr;
  ucs_status_t s = ucp_config_read(nullptr, nullptr, &raw_config);
  if (s != UCS_OK) {
    return UcsError("ucp_config_read", s);
  }
  UcpConfig config(raw_config);
  for (const auto& [name, value] : options_.ucp_options) {
    s = ucp_config_modify(config.get(), name.c_str(), value.c_str());
    if (s != UCS_OK) {
      return absl::InvalidArgumentError(
          absl::StrCat("ucx option ", name, "=", value, ": ", ucs_status_string(s)));
    }
  }
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED;
  params.features = UCP_FEATURE_AM | UCP_FEATURE_RMA | UCP_FEATURE_WAKEUP;
  // Context calls (ucp_mem_map/unmap of AllocateHost) may come from any thread.
  params.mt_workers_shared = 1;
  ucp_context_h ctx = nullptr;
  s = ucp_init(&params, config.get(), &ctx);
  if (s != UCS_OK) {
    return UcsError("ucp_init", s);
  }
  context_ = UcpContext(ctx, ContextDeleter());
  allocations_ = std::make_shared<UcxAllocations>();
  allocations_->context = context_;
  ucp_context_attr_t attr{};
  attr.field_mask = UCP_ATTR_FIELD_MEMORY_TYPES;
  if (ucp_context_query(context_.get(), &attr) == UCS_OK) {
    cuda_memory_ = (attr.memory_types & UCS_BIT(UCS_MEMORY_TYPE_CUDA)) != 0;
  }
  ucp_worker_params_t wp{};
  wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  wp.thread_mode = UCS_THREAD_MODE_SINGLE;  // only the progress thread touches UCX
  ucp_worker_h w = nullptr;
  s = ucp_worker_create(context_.get(), &wp, &w);
  if (s != UCS_OK) {
    return UcsError("ucp_worker_create", s);
  }
  worker_.reset(w);
  if (options_.blocking_progress) {
    s = ucp_worker_get_efd(worker_.get(), &efd_);
    if (s != UCS_OK) {
      return UcsError("ucp_worker_get_efd", s);
    }
  }
  const std::pair<unsigned, ucp_am_recv_callback_t> handlers[] = {
      {kAmHello, &AmHandler<kAmHello>},    {kAmHelloReply, &AmHandler<kAmHelloReply>},
      {kAmData, &AmHandler<kAmData>},      {kAmEnd, &AmHandler<kAmEnd>},
      {kAmCancel, &AmHandler<kAmCancel>},  {kAmStatus, &AmHandler<kAmStatus>},
      {kAmRmaReq, &AmHandler<kAmRmaReq>},  {kAmRmaGrant, &AmHandler<kAmRmaGrant>},
      {kAmRmaDone, &AmHandler<kAmRmaDone>}};
  for (const auto& [id, cb] : handlers) {
    ucp_am_handler_param_t hp{};
    hp.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB |
                    UCP_AM_HANDLER_PARAM_FIELD_ARG;
    hp.id = id;
    hp.cb = cb;
    hp.arg = this;
    s = ucp_worker_set_am_recv_handler(worker_.get(), &hp);
    if (s != UCS_OK) {
      return UcsError("ucp_worker_set_am_recv_handler", s);
    }
  }
  ucp_address_t* wa = nullptr;
  size_t wa_len = 0;
  s = ucp_worker_get_address(worker_.get(), &wa, &wa_len);
  if (s != UCS_OK) {
    return UcsError("ucp_worker_get_address", s);
  }
  worker_address_.assign(reinterpret_cast<const char*>(wa), wa_len);
  ucp_worker_release_address(worker_.get(), wa);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(options_.listen_port));
  if (::inet_pton(AF_INET, options_.listen_host.c_str(), &addr.sin_addr) != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("ucx: not a numeric IPv4 address: ", options_.listen_host));
  }
  ucp_listener_params_t lp{};
  lp.field_mask = UCP_LISTENER_PARAM_FIELD_SOCK_ADDR | UCP_LISTENER_PARAM_FIELD_CONN_HANDLER;
  lp.sockaddr.addr = reinterpret_cast<const sockaddr*>(&addr);
  lp.sockaddr.addrlen = sizeof(addr);
  lp.conn_handler.cb = &ConnHandler;
  lp.conn_handler.arg = this;
  ucp_listener_h l = nullptr;
  s = ucp_listener_create(worker_.get(), &lp, &l);
  if (s != UCS_OK) {
    return UcsError(absl::StrCat("ucp_listener_create ", options_.listen_host, ":",
                                 options_.listen_port, " (UCX_TLS must include tcp)"),
                    s);
  }
  listener_.reset(l);
  ucp_listener_attr_t la{};
  la.field_mask = UCP_LISTENER_ATTR_FIELD_SOCKADDR;
  s = ucp_listener_query(listener_.get(), &la);
  if (s != UCS_OK) {
    return UcsError("ucp_listener_query", s);
  }
  const auto* bound = reinterpret_cast<const sockaddr_in*>(&la.sockaddr);
  address_ = absl::StrCat(options_.listen_host, ":", ntohs(bound->sin_port));
  thread_ = std::thread([this] { Loop(); });
  return absl::OkStatus();
}

UcxTransport::~UcxTransport() {
  if (thread_.joinable()) {
    {
      absl::MutexLock lock(&mu_);
      stopping_ = true;
    }
    ucp_worker_signal(worker_.get());
    thread_.join();
  }
  // Eps were closed by the loop. Destroying the worker may still complete requests it purges
  // (their callbacks touch this object's maps), so it goes before any other member; the
  // context is last.
  listener_.reset();
  worker_.reset();
  mems_.clear();
}

void UcxTransport::Run(std::function<void()> fn) {
  {
    absl::MutexLock lock(&mu_);
    commands_.push_back(std::move(fn));
  }
  ucp_worker_signal(worker_.get());
}

void UcxTransport::RunSync(std::function<void()> fn) {
  absl::Notification done;
  Run([&] {
    fn();
    done.Notify();
  });
  done.WaitForNotification();
}

void UcxTransport::Loop() {
  while (true) {
    std::deque<std::function<void()>> cmds;
    bool stop = false;
    {
      absl::MutexLock lock(&mu_);
      cmds.swap(commands_);
      stop = stopping_;
    }
    for (auto& c : cmds) {
      c();
    }
    if (stop) {
      break;
    }
    while (ucp_worker_progress(worker_.get()) != 0) {
    }
    {
      auto buried = std::move(graveyard_);  // closes failed endpoints outside their callbacks
      graveyard_.clear();
    }
    {
      absl::MutexLock lock(&mu_);
      if (!commands_.empty() || stopping_) {
        continue;
      }
    }
    if (efd_ < 0) {
      continue;  // busy-poll mode
    }
    const ucs_status_t s = ucp_worker_arm(worker_.get());
    if (s == UCS_ERR_BUSY) {
      continue;  // events arrived meanwhile
    }
    pollfd p{efd_, POLLIN, 0};
    ::poll(&p, 1, 100);  // bounded: deadlines are also checked by callers
  }
  // Shutdown: fail what is pending, close endpoints while the worker still exists.
  const absl::Status down = absl::CancelledError("ucx transport shutting down");
  for (auto& [id, conn] : conns_) {
    for (const auto& [seq, unused] : conn->in_flight) {
      core_.Finish(TransferId(seq), down);
    }
    conn->dead = true;
  }
  while (!grants_.empty()) {
    ReleaseGrants(grants_.begin()->first.first, grants_.begin()->first.second, false, down);
  }
  {
    // Force-closes endpoints; their requests complete (cancelled) re-entrantly, and must find
    // conns_ already empty.
    auto doomed = std::move(conns_);
    conns_.clear();
    auto buried = std::move(graveyard_);
    graveyard_.clear();
  }
  graveyard_.clear();
  rma_posts_.clear();
}

UcxConn* UcxTransport::FindConn(uint64_t id) {
  auto it = conns_.find(id);
  return it == conns_.end() || it->second->dead ? nullptr : it->second.get();
}

void UcxTransport::OnConnRequest(ucp_conn_request_h req) {
  auto conn = std::make_unique<UcxConn>();
  conn->id = next_conn_++ | (uint64_t{1} << 63);
  conn->owner = this;
  ucp_ep_params_t ep{};
  ep.field_mask = UCP_EP_PARAM_FIELD_CONN_REQUEST | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                  UCP_EP_PARAM_FIELD_ERR_HANDLER;
  ep.conn_request = req;
  ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;
  ep.err_handler.cb = &EpErrorHandler;
  ep.err_handler.arg = conn.get();
  ucp_ep_h h = nullptr;
  if (ucp_ep_create(worker_.get(), &ep, &h) != UCS_OK) {
    ucp_listener_reject(listener_.get(), req);
    return;
  }
  conn->ep = std::make_unique<UcpEndpoint>(worker_.get(), h);
  conns_[conn->id] = std::move(conn);
}

void UcxTransport::OnEpError(UcxConn* conn, ucs_status_t status) {
  if (conn->dead) {
    return;
  }
  conn->dead = true;
  const absl::Status why =
      absl::UnavailableError(absl::StrCat("ucx connection to instance ", conn->peer_instance,
                                          " failed: ", ucs_status_string(status), " (peer died?)"));
  for (const auto& [seq, unused] : conn->in_flight) {
    core_.Finish(TransferId(seq), why);
  }
  conn->in_flight.clear();
  std::vector<uint64_t> held;
  for (const auto& [key, grants] : grants_) {
    if (key.first == conn->id) {
      held.push_back(key.second);
    }
  }
  for (uint64_t seq : held) {
    ReleaseGrants(conn->id, seq, false, why);
  }
  for (auto it = rma_posts_.begin(); it != rma_posts_.end();) {
    if (it->second.conn == conn->id && !it->second.started) {
      rma_posts_.erase(it++);  // never granted: nothing outstanding
    } else {
      ++it;
    }
  }
  core_.FailExpectationsFromSource(conn->id, why);
  {
    absl::MutexLock lock(&mu_);
    conn_dead_[conn->id] = true;
  }
  auto it = conns_.find(conn->id);
  if (it != conns_.end()) {
    graveyard_.push_back(std::move(it->second));
    conns_.erase(it);
  }
}

void UcxTransport::SendAm(UcxConn& conn, unsigned id, const void* header, size_t header_len,
                          const void* data, size_t len, uint64_t seq, bool on_data_ep,
                          std::string payload) {
  auto* ctx = new SendCtx{this, seq, std::string(static_cast<const char*>(header), header_len),
                          std::move(payload)};
  if (!ctx->payload.empty()) {
    data = ctx->payload.data();
    len = ctx->payload.size();
  }
  ucp_request_param_t p{};
  p.op_attr_mask =
      UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS;
  p.cb.send = &SendCallback;
  p.user_data = ctx;
  // Control messages ask for a reply endpoint (the receiver maps it to its connection); the
  // data endpoint's messages name the connection in their header instead.
  p.flags = on_data_ep ? 0 : UCP_AM_SEND_FLAG_REPLY;
  ucp_ep_h ep = on_data_ep ? conn.data() : conn.ep->get();
  ucs_status_ptr_t req = ucp_am_send_nbx(ep, id, ctx->owned.data(), header_len, data, len, &p);
  if (!UCS_PTR_IS_PTR(req)) {
    OnSendDone(seq, UCS_PTR_STATUS(req));
    delete ctx;
  }
}

void UcxTransport::OnSendDone(uint64_t seq, ucs_status_t status) {
  if (status != UCS_OK && seq != 0) {
    core_.Finish(TransferId(seq), UcsError("ucx send", status));
  }
}

void UcxTransport::SendStatus(uint64_t conn_id, uint64_t seq, const absl::Status& s) {
  UcxConn* conn = FindConn(conn_id);
  if (conn == nullptr) {
    return;
  }
  StatusHeader h{seq, static_cast<uint32_t>(s.code()), 0};
  auto* ctx = new SendCtx{this, 0, std::string(s.message())};
  std::string header(reinterpret_cast<const char*>(&h), sizeof(h));
  ctx->owned = header + ctx->owned;  // header then message, one buffer
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  p.cb.send = &SendCallback;
  p.user_data = ctx;
  ucs_status_ptr_t req =
      ucp_am_send_nbx(conn->ep->get(), kAmStatus, ctx->owned.data(), sizeof(h),
                      ctx->owned.data() + sizeof(h), ctx->owned.size() - sizeof(h), &p);
  if (!UCS_PTR_IS_PTR(req)) {
    delete ctx;
  }
}

// Maps a reply ep back to our inbound connection id.
ucs_status_t UcxTransport::OnAm(unsigned id, const void* header, size_t header_length, void* data,
                                size_t length, const ucp_am_recv_param_t* param) {
  uint64_t conn_id = 0;
  if (param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) {
    for (const auto& [cid, conn] : conns_) {
      if (conn->ep != nullptr && conn->ep->get() == param->reply_ep) {
        conn_id = cid;
        break;
      }
    }
  }
  const bool rndv = (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0;
  switch (id) {
    case kAmHello: {
      if (header_length != sizeof(Hello) || conn_id == 0) {
        return UCS_OK;
      }
      Hello h;
      std::memcpy(&h, header, sizeof(h));
      conns_[conn_id]->peer_instance = h.instance;
      Hello reply{core_.instance_id(), kTransportProtocolVersion, h.cookie, conn_id};
      SendAm(*conns_[conn_id], kAmHelloReply, &reply, sizeof(reply), nullptr, 0, 0,
             /*on_data_ep=*/false, worker_address_);
      return UCS_OK;
    }
    case kAmHelloReply: {
      if (header_length == sizeof(Hello)) {
        HelloReply r;
        std::memcpy(&r.hello, header, sizeof(r.hello));
        if (!rndv) {
          r.worker_address.assign(static_cast<const char*>(data), length);
        }
        absl::MutexLock lock(&mu_);
        hello_replies_[r.hello.cookie] = std::move(r);
      }
      return UCS_OK;
    }
    case kAmRmaGrant: {
      if (header_length == sizeof(StatusHeader)) {
        StatusHeader h;
        std::memcpy(&h, header, sizeof(h));
        OnRmaGrant(h.seq);
      }
      return UCS_OK;
    }
    case kAmStatus: {
      if (header_length != sizeof(StatusHeader)) {
        return UCS_OK;
      }
      StatusHeader h;
      std::memcpy(&h, header, sizeof(h));
      const auto code = static_cast<absl::StatusCode>(h.code);
      std::string msg = rndv ? "" : std::string(static_cast<const char*>(data), length);
      for (auto& [cid, conn] : conns_) {
        conn->in_flight.erase(h.seq);
      }
      auto rp = rma_posts_.find(h.seq);
      if (rp != rma_posts_.end() && !rp->second.started) {
        rma_posts_.erase(rp);  // refused before any put: nothing outstanding
      }
      core_.Finish(TransferId(h.seq), code == absl::StatusCode::kOk
                                          ? absl::OkStatus()
                                          : absl::Status(code, absl::StrCat("receiver: ", msg)));
      return UCS_OK;
    }
    default:
      break;
  }
  if (header_length != sizeof(DataHeader)) {
    return UCS_OK;
  }
  DataHeader h;
  std::memcpy(&h, header, sizeof(h));
  if (conn_id == 0) {
    // Data endpoint: the header names our (inbound) connection.
    auto it = conns_.find(h.rconn);
    if (it == conns_.end() || it->second->client || it->second->dead) {
      return UCS_OK;
    }
    conn_id = h.rconn;
  }
  if (id == kAmRmaReq) {
    OnRmaReq(conn_id, h, data, length, rndv);
    return UCS_OK;
  }
  if (id == kAmRmaDone) {
    ReleaseGrants(conn_id, h.seq, true, absl::OkStatus());
    SendStatus(conn_id, h.seq, core_.CompleteExpectation(h.tag, h.nonce));
    return UCS_OK;
  }
  if (id == kAmCancel) {
    const absl::Status why = absl::CancelledError(
        absl::StrCat("sender cancelled transfer tag ", h.tag, " before completion"));
    ReleaseGrants(conn_id, h.seq, false, why);
    core_.FailExpectation(h.tag, h.nonce, why);
    auto it = seqs_.find({conn_id, h.seq});
    if (it != seqs_.end()) {
      it->second.failed = true;  // later DATA is dropped; END forgets the sequence
    }
    return UCS_OK;
  }
  SeqState& st = seqs_[{conn_id, h.seq}];
  if (id == kAmEnd) {
    st.end_pending = true;
    st.end = h;
    SeqProgress(conn_id, h.seq);
    return UCS_OK;
  }
  // kAmData
  if (st.failed) {
    return UCS_OK;  // dropped (rendezvous data is released by returning OK)
  }
  absl::StatusOr<WriteGrant> grant =
      core_.BeginWrite(h.tag, h.nonce, h.dst_first, h.num_blocks, conn_id);
  if (grant.ok() && grant->length != length) {
    core_.EndWrite(*grant, false, absl::DataLossError("ucx frame length mismatch"));
    grant = absl::DataLossError("ucx frame length does not match its blocks");
  }
  if (grant.ok() && cuda_memory_) {
    // Safety net: active-message data into device memory would be a CPU copy (eager) or need
    // a memory-typed receive; senders put into device regions instead (StartPost). Without
    // CUDA support no device region exists.
    absl::StatusOr<transport_internal::RegionInfo> region = core_.GetRegion(grant->exp->region);
    if (region.ok() && region->region.kind == MemoryKind::kCuda) {
      core_.EndWrite(*grant, false,
                     absl::FailedPreconditionError("ucx: active-message data for a device region"));
      grant = absl::FailedPreconditionError(
          "ucx: device-memory blocks are written by RMA only; the sender used active messages");
    }
  }
  if (!grant.ok()) {
    st.failed = true;
    SendStatus(conn_id, h.seq, grant.status());
    return UCS_OK;
  }
  if (!rndv) {
    std::memcpy(grant->dst, data, length);
    core_.EndWrite(*grant, true);
    return UCS_OK;
  }
  auto* ctx = new RecvCtx{this, *grant, conn_id, h.seq};
  ++st.outstanding;
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  p.cb.recv_am = &RecvCallback;
  p.user_data = ctx;
  ucs_status_ptr_t req = ucp_am_recv_data_nbx(worker_.get(), data, grant->dst, length, &p);
  if (!UCS_PTR_IS_PTR(req)) {
    OnRecvDone(ctx, UCS_PTR_STATUS(req));
  }
  return UCS_INPROGRESS;
}

void UcxTransport::OnRecvDone(RecvCtx* ctx, ucs_status_t status) {
  std::unique_ptr<RecvCtx> owned(ctx);
  const bool ok = status == UCS_OK;
  core_.EndWrite(ctx->grant, ok, ok ? absl::OkStatus() : UcsError("ucx receive", status));
  auto it = seqs_.find({ctx->conn, ctx->seq});
  if (it == seqs_.end()) {
    return;
  }
  --it->second.outstanding;
  if (!ok && !it->second.failed) {
    it->second.failed = true;
    SendStatus(ctx->conn, ctx->seq, UcsError("ucx receive", status));
  }
  SeqProgress(ctx->conn, ctx->seq);
}

// Answers END once every run of the sequence landed.
void UcxTransport::SeqProgress(uint64_t conn_id, uint64_t seq) {
  auto it = seqs_.find({conn_id, seq});
  if (it == seqs_.end()) {
    return;
  }
  SeqState& st = it->second;
  if (!st.end_pending || st.outstanding > 0) {
    return;
  }
  if (!st.failed) {
    SendStatus(conn_id, seq, core_.CompleteExpectation(st.end.tag, st.end.nonce));
  }
  seqs_.erase(it);
}

void UcxTransport::OnRmaReq(uint64_t conn_id, const DataHeader& h, const void* data, size_t length,
                            bool rndv) {
  if (rndv || length % sizeof(RunWire) != 0 || length == 0) {
    SendStatus(conn_id, h.seq, absl::InvalidArgumentError("malformed ucx RMA request"));
    return;
  }
  std::vector<WriteGrant> held;
  absl::Status error;
  for (size_t off = 0; off < length; off += sizeof(RunWire)) {
    RunWire r;
    std::memcpy(&r, static_cast<const char*>(data) + off, sizeof(r));
    absl::StatusOr<WriteGrant> g =
        core_.BeginWrite(h.tag, h.nonce, r.dst_first, r.num_blocks, conn_id);
    if (!g.ok()) {
      error = g.status();
      break;
    }
    held.push_back(*std::move(g));
  }
  if (!error.ok()) {
    // Nothing was written; a partly granted request fails the expectation (a broken sender).
    for (const WriteGrant& g : held) {
      core_.EndWrite(g, false, error);
    }
    SendStatus(conn_id, h.seq, error);
    return;
  }
  grants_[{conn_id, h.seq}] = std::move(held);
  UcxConn* conn = FindConn(conn_id);
  if (conn == nullptr) {
    ReleaseGrants(conn_id, h.seq, false, absl::UnavailableError("ucx connection closed"));
    return;
  }
  StatusHeader g{h.seq, 0, 0};
  SendAm(*conn, kAmRmaGrant, &g, sizeof(g), nullptr, 0, 0);
}

void UcxTransport::ReleaseGrants(uint64_t conn_id, uint64_t seq, bool ok, const absl::Status& why) {
  auto it = grants_.find({conn_id, seq});
  if (it == grants_.end()) {
    return;
  }
  for (const WriteGrant& g : it->second) {
    core_.EndWrite(g, ok, why);
  }
  grants_.erase(it);
}

void UcxTransport::OnRmaGrant(uint64_t seq) {
  auto it = rma_posts_.find(seq);
  if (it == rma_posts_.end() || it->second.started) {
    return;
  }
  RmaPost& rp = it->second;
  UcxConn* conn = FindConn(rp.conn);
  if (conn == nullptr) {
    rma_posts_.erase(it);
    return;
  }
  const PreparedPost& post = rp.post;
  DataHeader h{seq, post.desc.tag, post.desc.region_nonce, conn->remote_conn, 0, 0};
  if (!core_.IsPending(post.id)) {
    SendAm(*conn, kAmCancel, &h, sizeof(h), nullptr, 0, 0);  // releases the held runs
    conn->in_flight.erase(seq);
    rma_posts_.erase(it);
    return;
  }
  rp.started = true;
  auto rkey_it = conn->rkeys.find(post.desc.region_nonce);
  uint64_t remote_base = 0;
  {
    transport_internal::ByteReader r(post.desc.blob);
    remote_base = r.U64();
    const std::string packed = r.Bytes();
    if (!r.ok() || packed.empty()) {
      rp.error = absl::FailedPreconditionError(
          "ucx RMA: the descriptor carries no rkey (receiver registration failed to pack one)");
    } else if (rkey_it == conn->rkeys.end()) {
      if (conn->rkeys.size() >= 64) {  // bounded: receivers re-register rarely
        for (auto& [nonce, rkey] : conn->rkeys) {
          ucp_rkey_destroy(rkey);
        }
        conn->rkeys.clear();
      }
      ucp_rkey_h rkey = nullptr;
      const ucs_status_t st = ucp_ep_rkey_unpack(conn->data(), packed.data(), &rkey);
      if (st != UCS_OK) {
        rp.error = UcsError("ucp_ep_rkey_unpack", st);
      } else {
        rkey_it = conn->rkeys.emplace(post.desc.region_nonce, rkey).first;
      }
    }
  }
  if (rp.error.ok()) {
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    p.cb.send = &RmaOpCallback;
    for (const BlockRun& run : post.runs) {
      const uint64_t len = uint64_t{run.num_blocks} * post.block_bytes;
      auto* ctx = new RmaOpCtx{this, seq};
      p.user_data = ctx;
      ++rp.outstanding;
      ucs_status_ptr_t req = ucp_put_nbx(
          conn->data(), post.src_base + uint64_t{run.src_first} * post.block_bytes, len,
          remote_base + uint64_t{run.dst_first} * post.block_bytes, rkey_it->second, &p);
      if (!UCS_PTR_IS_PTR(req)) {
        delete ctx;
        --rp.outstanding;
        if (UCS_PTR_STATUS(req) != UCS_OK) {
          rp.error = UcsError("ucp_put_nbx", UCS_PTR_STATUS(req));
          break;
        }
      }
    }
    // The flush completes once every put is remotely complete.
    auto* ctx = new RmaOpCtx{this, seq};
    p.user_data = ctx;
    ++rp.outstanding;
    ucs_status_ptr_t req = ucp_ep_flush_nbx(conn->data(), &p);
    if (!UCS_PTR_IS_PTR(req)) {
      delete ctx;
      --rp.outstanding;
      if (UCS_PTR_STATUS(req) != UCS_OK && rp.error.ok()) {
        rp.error = UcsError("ucp_ep_flush_nbx", UCS_PTR_STATUS(req));
      }
    }
  }
  if (rp.outstanding == 0) {
    FinishRmaPost(seq);
  }
}

void UcxTransport::OnRmaOpDone(uint64_t seq, ucs_status_t status) {
  auto it = rma_posts_.find(seq);
  if (it == rma_posts_.end()) {
    return;
  }
  if (status != UCS_OK && it->second.error.ok()) {
    it->second.error = UcsError("ucx put", status);
  }
  if (--it->second.outstanding == 0) {
    FinishRmaPost(seq);
  }
}

// Every put of `seq` completed (or failed): tell the receiver, which then answers with a status.
void UcxTransport::FinishRmaPost(uint64_t seq) {
  auto it = rma_posts_.find(seq);
  RmaPost rp = std::move(it->second);
  rma_posts_.erase(it);
  UcxConn* conn = FindConn(rp.conn);
  if (conn == nullptr) {
    return;  // the connection failure already failed the transfer
  }
  DataHeader h{seq, rp.post.desc.tag, rp.post.desc.region_nonce, conn->remote_conn, 0, 0};
  if (!rp.error.ok() || !core_.IsPending(rp.post.id)) {
    core_.Finish(rp.post.id, rp.error);  // no-op when already finished (cancel, deadline)
    conn->in_flight.erase(seq);
    SendAm(*conn, kAmCancel, &h, sizeof(h), nullptr, 0, 0);  // releases the held runs
    return;
  }
  SendAm(*conn, kAmRmaDone, &h, sizeof(h), nullptr, 0, seq);
}

void UcxTransport::SetupDataPath(UcxConn& conn, const std::string& worker_address) {
  const UcxDataPath want = options_.data_path;
  if (!worker_address.empty()) {
    ucp_ep_params_t ep{};
    ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
    ep.address = reinterpret_cast<const ucp_address_t*>(worker_address.data());
    ep.err_mode = UCP_ERR_HANDLING_MODE_NONE;
    ucp_ep_h h = nullptr;
    if (ucp_ep_create(worker_.get(), &ep, &h) == UCS_OK) {
      auto data_ep = std::make_unique<UcpEndpoint>(worker_.get(), h);
      const std::string info = EpInfo(h);
      const std::string am = LaneTransport(info, "am_bw#0");
      const std::string rma = LaneTransport(info, "rma_bw#0");
      if (IsFastTransport(am) || IsFastTransport(rma)) {
        conn.data_ep = std::move(data_ep);
      }
      conn.data_lanes =
          absl::StrCat("am=", am.empty() ? "-" : am, " rma=", rma.empty() ? "-" : rma);
      conn.rma = want == UcxDataPath::kAuto && conn.data_ep != nullptr && IsGoodPutTransport(rma);
      conn.mapped_rma =
          want == UcxDataPath::kAuto && conn.data_ep != nullptr && IsSharedMemoryTransport(am);
    }
  }
  if (want == UcxDataPath::kRma) {
    conn.rma = true;  // explicitly asked for, even over tcp
  }
  LOG(INFO) << "ucx connection " << conn.id << ": data endpoint "
            << (conn.data_ep != nullptr ? "yes" : "no") << " (" << conn.data_lanes
            << "), data path "
            << (conn.rma ? "rma" : conn.mapped_rma ? "am, rma into ucx-allocated pools" : "am");
}

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
    return absl::ResourceExhaustedError(absl::StrCat(
        "allocate host memory: ucp_mem_map(ALLOCATE) of ", bytes, " bytes: ",
        ucs_status_string(st)));
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

absl::StatusOr<PeerHandle> UcxTransport::Connect(absl::string_view endpoint) {
  absl::StatusOr<EndpointInfo> e = EndpointInfo::Decode(endpoint);
  if (!e.ok()) {
    return e.status();
  }
  if (e->backend != "ucx") {
    return absl::FailedPreconditionError(
        absl::StrCat("ucx transport cannot connect to a ", e->backend, " endpoint"));
  }
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [handle, conn] : peer_conn_) {
      if (conn_instance_[conn] == e->instance_id && !conn_dead_[conn]) {
        return PeerHandle(handle);
      }
    }
  }
  std::pair<std::string, std::string> hp = absl::StrSplit(e->address, absl::MaxSplits(':', 1));
  int port = 0;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  if (!absl::SimpleAtoi(hp.second, &port) ||
      ::inet_pton(AF_INET, hp.first.c_str(), &addr.sin_addr) != 1) {
    return absl::InvalidArgumentError(absl::StrCat("bad ucx address: ", e->address));
  }
  addr.sin_port = htons(static_cast<uint16_t>(port));
  const uint64_t cookie = transport_internal::RandomId();
  uint64_t conn_id = 0;
  ucs_status_t status = UCS_OK;
  RunSync([&] {
    auto conn = std::make_unique<UcxConn>();
    conn->id = next_conn_++;
    conn->owner = this;
    conn->client = true;
    ucp_ep_params_t ep{};
    ep.field_mask = UCP_EP_PARAM_FIELD_FLAGS | UCP_EP_PARAM_FIELD_SOCK_ADDR |
                    UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER;
    ep.flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER;
    ep.sockaddr.addr = reinterpret_cast<const sockaddr*>(&addr);
    ep.sockaddr.addrlen = sizeof(addr);
    ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    ep.err_handler.cb = &EpErrorHandler;
    ep.err_handler.arg = conn.get();
    ucp_ep_h h = nullptr;
    status = ucp_ep_create(worker_.get(), &ep, &h);
    if (status != UCS_OK) {
      return;
    }
    conn->ep = std::make_unique<UcpEndpoint>(worker_.get(), h);
    Hello hello{core_.instance_id(), kTransportProtocolVersion, cookie};
    SendAm(*conn, kAmHello, &hello, sizeof(hello), nullptr, 0, 0);
    conn_id = conn->id;
    conns_[conn->id] = std::move(conn);
  });
  if (status != UCS_OK) {
    return UcsError(absl::StrCat("ucx connect ", e->address), status);
  }
  HelloReply reply;
  {
    absl::MutexLock lock(&mu_);
    auto has_reply = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return hello_replies_.contains(cookie) || conn_dead_[conn_id];
    };
    mu_.AwaitWithTimeout(absl::Condition(&has_reply), options_.connect_timeout);
    auto it = hello_replies_.find(cookie);
    if (it == hello_replies_.end()) {
      conn_dead_[conn_id] = true;
      return absl::UnavailableError(
          absl::StrCat("ucx handshake with ", e->address, " failed or timed out"));
    }
    reply = it->second;
    hello_replies_.erase(it);
  }
  if (reply.hello.version != kTransportProtocolVersion || reply.hello.instance != e->instance_id) {
    return absl::FailedPreconditionError(
        absl::StrCat("ucx handshake: endpoint names instance ", e->instance_id, " protocol ",
                     kTransportProtocolVersion, " but ", e->address, " is instance ",
                     reply.hello.instance, " protocol ", reply.hello.version));
  }
  RunSync([&] {
    if (UcxConn* c = FindConn(conn_id)) {
      c->peer_instance = reply.hello.instance;
      c->remote_conn = reply.hello.conn;
      SetupDataPath(*c, reply.worker_address);
      VLOG(2) << "ucx control endpoint:\n" << EpInfo(c->ep->get());
    }
  });
  absl::MutexLock lock(&mu_);
  const uint32_t handle = next_peer_++;
  peer_conn_[handle] = conn_id;
  conn_instance_[conn_id] = reply.hello.instance;
  VLOG(1) << "ucx transport connected to " << e->address;
  return PeerHandle(handle);
}

absl::StatusOr<TransferId> UcxTransport::PostTransfer(PeerHandle peer, uint64_t tag,
                                                      RegionHandle src,
                                                      absl::Span<const BlockPair> pairs,
                                                      absl::string_view remote_descriptor,
                                                      const TransferOptions& options) {
  uint64_t conn_id = 0, instance = 0;
  {
    absl::MutexLock lock(&mu_);
    auto it = peer_conn_.find(peer.value());
    if (it == peer_conn_.end()) {
      return absl::NotFoundError(absl::StrCat("post: unknown peer ", peer.value()));
    }
    conn_id = it->second;
    instance = conn_instance_[conn_id];
    if (conn_dead_[conn_id]) {
      return absl::UnavailableError(
          absl::StrCat("post: connection to peer ", peer.value(), " failed; Connect again"));
    }
  }
  absl::StatusOr<PreparedPost> post =
      core_.PreparePost(instance, tag, src, pairs, remote_descriptor, options);
  if (!post.ok()) {
    return post.status();
  }
  const TransferId id = post->id;
  Run([this, conn_id, p = *std::move(post)]() mutable { StartPost(conn_id, std::move(p)); });
  return id;
}

void UcxTransport::StartPost(uint64_t conn_id, PreparedPost post) {
  UcxConn* conn = FindConn(conn_id);
  if (conn == nullptr) {
    core_.Finish(post.id, absl::UnavailableError("ucx connection failed before the post"));
    return;
  }
  const uint64_t seq = post.id.value();
  DataHeader h{seq, post.desc.tag, post.desc.region_nonce, conn->remote_conn, 0, 0};
  if (!core_.IsPending(post.id)) {
    SendAm(*conn, kAmCancel, &h, sizeof(h), nullptr, 0, 0, /*on_data_ep=*/!conn->rma);
    return;
  }
  // RMA when the connection uses it; for device-memory destinations (UCX moves them with
  // cuda_ipc/cuda_copy/RDMA; the AM path would make the receiver's CPU copy into device memory);
  // and when the receiver's region is a UCX allocation that this connection's shm lanes reach
  // with a plain memcpy (see SetupDataPath).
  const bool rma = conn->rma || DescriptorTargetsDevice(post.desc.blob) ||
                   (conn->mapped_rma && DescriptorIsMapped(post.desc.blob));
  conn->in_flight[seq] = UcxConn::InFlight{h, rma};
  if (rma) {    // Ask the receiver to hold the runs; OnRmaGrant puts them.
    std::string runs;
    runs.reserve(post.runs.size() * sizeof(RunWire));
    for (const BlockRun& run : post.runs) {
      RunWire w{run.dst_first, run.num_blocks};
      runs.append(reinterpret_cast<const char*>(&w), sizeof(w));
    }
    RmaPost& rp = rma_posts_[seq];
    rp.conn = conn_id;
    rp.post = std::move(post);
    SendAm(*conn, kAmRmaReq, &h, sizeof(h), nullptr, 0, seq, /*on_data_ep=*/false, std::move(runs));
    return;
  }
  const uint32_t frame_blocks =
      static_cast<uint32_t>(std::max<uint64_t>(1, kMaxFrameBytes / post.block_bytes));
  for (const BlockRun& run : post.runs) {
    for (uint32_t off = 0; off < run.num_blocks; off += frame_blocks) {
      h.dst_first = run.dst_first + off;
      h.num_blocks = std::min(frame_blocks, run.num_blocks - off);
      SendAm(*conn, kAmData, &h, sizeof(h),
             post.src_base + uint64_t{run.src_first + off} * post.block_bytes,
             uint64_t{h.num_blocks} * post.block_bytes, seq, /*on_data_ep=*/true);
    }
  }
  h.dst_first = 0;
  h.num_blocks = 0;
  SendAm(*conn, kAmEnd, &h, sizeof(h), nullptr, 0, seq, /*on_data_ep=*/true);
}

absl::Status UcxTransport::Cancel(TransferId id) {
  absl::StatusOr<TransportCore::CancelResult> r = core_.Cancel(id);
  if (!r.ok()) {
    return r.status();
  }
  if (r->was_pending && !r->expectation) {
    // Frames already handed to UCX still go out; CANCEL follows them on the same endpoint, so
    // the receiver fails its expectation unless every block had already arrived.
    Run([this, seq = id.value()] {
      for (auto& [cid, conn] : conns_) {
        auto it = conn->in_flight.find(seq);
        if (it != conn->in_flight.end() && !conn->dead) {
          if (rma_posts_.contains(seq)) {
            return;  // the RMA state machine tells the receiver once no put is in flight
          }
          DataHeader h = it->second.h;
          const bool rma = it->second.rma;
          conn->in_flight.erase(it);
          SendAm(*conn, kAmCancel, &h, sizeof(h), nullptr, 0, 0, /*on_data_ep=*/!rma);
          return;
        }
      }
    });
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<KvTransport>> CreateUcxTransport(
    const UcxTransportOptions& options) {
  return UcxTransport::Create(options);
}

}  // namespace pd::transport
