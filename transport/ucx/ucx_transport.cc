// UCX backend. One ucp worker driven by one progress thread: every UCX call happens on that
// thread (API calls enqueue closures and signal the worker), so UCX runs in single-thread mode
// and no UCX handle is shared. The thread sleeps on the worker's event fd when idle
// (ucp_worker_arm + poll) instead of burning a core.
//
// Data path: active messages. Each coalesced run is one ucp_am_send_nbx whose header names
// (seq, tag, nonce, dst run); the receiver validates the run against its expectation before
// it accepts any byte, then receives eager data by memcpy or rendezvous data with
// ucp_am_recv_data_nbx straight into the destination blocks (UCX then pulls with get_zcopy
// over shm/cma/rdma where available: one-sided underneath, receiver-driven, so a stale or
// foreign descriptor can never write). END is acknowledged once every run landed.
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
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "common/base/status_macros.h"
#include "common/log/log.h"
#include "transport/internal/byte_codec.h"
#include "transport/internal/transport_core.h"

namespace pd::transport {
namespace {

using transport_internal::PreparedPost;
using transport_internal::TransportCore;
using transport_internal::WriteGrant;

constexpr uint64_t kMaxFrameBytes = 16 << 20;

enum AmId : unsigned {
  kAmHello = 1,       // header Hello, REPLY flag
  kAmHelloReply = 2,  // header Hello
  kAmData = 3,        // header DataHeader, payload
  kAmEnd = 4,         // header DataHeader (runs unused)
  kAmCancel = 5,      // header DataHeader
  kAmStatus = 6,      // header StatusHeader, payload = message
};

struct Hello {
  uint64_t instance = 0;
  uint64_t version = 0;
  uint64_t cookie = 0;
};

struct DataHeader {
  uint64_t seq = 0;
  uint64_t tag = 0;
  uint64_t nonce = 0;
  uint32_t dst_first = 0;
  uint32_t num_blocks = 0;
};

struct StatusHeader {
  uint64_t seq = 0;
  uint32_t code = 0;
  uint32_t pad = 0;
};

absl::Status UcsError(absl::string_view what, ucs_status_t s) {
  return absl::UnavailableError(absl::StrCat(what, ": ", ucs_status_string(s)));
}

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
using UcpContext = std::unique_ptr<ucp_context, ContextDeleter>;
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

class UcxTransport;

// Per-connection state. Client side: a Peer (we send data); server side: an inbound
// connection (we receive). Both are keyed by a small id used as the core's `source`.
struct UcxConn {
  uint64_t id = 0;
  uint64_t peer_instance = 0;
  std::unique_ptr<UcpEndpoint> ep;
  bool dead = false;
  bool client = false;
  absl::flat_hash_map<uint64_t, DataHeader> in_flight;  // client: seq -> ids, awaiting status
  UcxTransport* owner = nullptr;
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

class UcxTransport : public KvTransport {
 public:
  static absl::StatusOr<std::unique_ptr<KvTransport>> Create(const UcxTransportOptions& o);
  ~UcxTransport() override;

  absl::string_view Name() const override { return "ucx"; }
  TransportCaps Caps() const override {
    TransportCaps c;
    c.host_memory = true;
    c.two_sided = true;
    c.notifications = true;
    c.cancel = true;
    return c;
  }
  absl::StatusOr<RegionHandle> Register(const MemoryRegion& region) override;
  absl::Status Deregister(RegionHandle region) override;
  std::string LocalEndpoint() const override;
  absl::StatusOr<PeerHandle> Connect(absl::string_view endpoint) override;
  absl::StatusOr<Expectation> ExpectTransfer(uint64_t tag, RegionHandle dst,
                                             absl::Span<const BlockId> dst_blocks,
                                             const TransferOptions& options) override {
    return core_.Expect(tag, dst, dst_blocks, options);
  }
  absl::StatusOr<TransferId> PostTransfer(PeerHandle peer, uint64_t tag, RegionHandle src,
                                          absl::Span<const BlockPair> pairs,
                                          absl::string_view remote_descriptor,
                                          const TransferOptions& options) override;
  absl::StatusOr<TransferState> Poll(TransferId id) override { return core_.Poll(id); }
  absl::StatusOr<TransferState> Wait(TransferId id, absl::Duration timeout) override {
    return core_.Wait(id, timeout);
  }
  absl::Status Cancel(TransferId id) override;

  // ---- progress-thread callbacks
  void OnConnRequest(ucp_conn_request_h req);
  void OnEpError(UcxConn* conn, ucs_status_t status);
  ucs_status_t OnAm(unsigned id, const void* header, size_t header_length, void* data,
                    size_t length, const ucp_am_recv_param_t* param);
  void OnRecvDone(RecvCtx* ctx, ucs_status_t status);
  void OnSendDone(uint64_t seq, ucs_status_t status);

 private:
  explicit UcxTransport(UcxTransportOptions o) : options_(std::move(o)), core_("ucx") {}
  absl::Status Init();
  void Loop();
  // Runs `fn` on the progress thread; RunSync waits for it.
  void Run(std::function<void()> fn);
  void RunSync(std::function<void()> fn);
  void SendAm(UcxConn& conn, unsigned id, const void* header, size_t header_len, const void* data,
              size_t len, uint64_t seq);
  void SendStatus(uint64_t conn_id, uint64_t seq, const absl::Status& s);
  void StartPost(uint64_t conn_id, PreparedPost post);
  void SeqProgress(uint64_t conn_id, uint64_t seq);
  UcxConn* FindConn(uint64_t id);

  const UcxTransportOptions options_;
  TransportCore core_;
  std::string address_;

  // Progress-thread-only state.
  UcpContext context_;
  UcpWorker worker_;
  UcpListener listener_;
  int efd_ = -1;
  uint64_t next_conn_ = 1;
  absl::flat_hash_map<uint64_t, std::unique_ptr<UcxConn>> conns_;
  absl::flat_hash_map<std::pair<uint64_t, uint64_t>, SeqState> seqs_;  // (conn, seq)
  absl::flat_hash_map<uint64_t, std::unique_ptr<UcpMem>> mems_;        // by region handle
  std::vector<std::unique_ptr<UcxConn>> graveyard_;  // failed conns, closed by the loop

  // Shared with API threads.
  absl::Mutex mu_;
  std::deque<std::function<void()>> commands_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  absl::flat_hash_map<uint64_t, Hello> hello_replies_ ABSL_GUARDED_BY(mu_);  // by cookie
  absl::flat_hash_map<uint32_t, uint64_t> peer_conn_ ABSL_GUARDED_BY(mu_);   // handle -> conn
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
  std::string owned;  // keeps small headers/messages alive until completion
};
void SendCallback(void* request, ucs_status_t status, void* user_data) {
  auto* ctx = static_cast<SendCtx*>(user_data);
  ctx->t->OnSendDone(ctx->seq, status);
  delete ctx;
  ucp_request_free(request);
}

absl::StatusOr<std::unique_ptr<KvTransport>> UcxTransport::Create(const UcxTransportOptions& o) {
  if (o.data_path == UcxDataPath::kRma) {
    // TODO(#4): explicit ucp_put_nbx + flush + completion AM path.
    return absl::UnimplementedError(
        "ucx transport: the explicit RMA (put + flush) data path is not implemented; use "
        "kAuto/kActiveMessage (rendezvous already pulls with get_zcopy over shm/rdma)");
  }
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
  params.field_mask = UCP_PARAM_FIELD_FEATURES;
  params.features = UCP_FEATURE_AM | UCP_FEATURE_RMA | UCP_FEATURE_WAKEUP;
  ucp_context_h ctx = nullptr;
  s = ucp_init(&params, config.get(), &ctx);
  if (s != UCS_OK) {
    return UcsError("ucp_init", s);
  }
  context_.reset(ctx);
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
      {kAmHello, &AmHandler<kAmHello>},   {kAmHelloReply, &AmHandler<kAmHelloReply>},
      {kAmData, &AmHandler<kAmData>},     {kAmEnd, &AmHandler<kAmEnd>},
      {kAmCancel, &AmHandler<kAmCancel>}, {kAmStatus, &AmHandler<kAmStatus>}};
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
  // Members release in reverse order: eps were closed by the loop; mems, listener, worker,
  // context follow.
  mems_.clear();
  listener_.reset();
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
    graveyard_.clear();  // closes failed endpoints outside their callbacks
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
  for (auto& [id, conn] : conns_) {
    for (const auto& [seq, unused] : conn->in_flight) {
      core_.Finish(TransferId(seq), absl::CancelledError("ucx transport shutting down"));
    }
    conn->ep.reset();
  }
  conns_.clear();
  graveyard_.clear();
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
                          const void* data, size_t len, uint64_t seq) {
  auto* ctx = new SendCtx{this, seq, std::string(static_cast<const char*>(header), header_len)};
  ucp_request_param_t p{};
  p.op_attr_mask =
      UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS;
  p.cb.send = &SendCallback;
  p.user_data = ctx;
  p.flags = UCP_AM_SEND_FLAG_REPLY;
  ucs_status_ptr_t req =
      ucp_am_send_nbx(conn.ep->get(), id, ctx->owned.data(), header_len, data, len, &p);
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
      Hello reply{core_.instance_id(), kTransportProtocolVersion, h.cookie};
      SendAm(*conns_[conn_id], kAmHelloReply, &reply, sizeof(reply), nullptr, 0, 0);
      return UCS_OK;
    }
    case kAmHelloReply: {
      if (header_length == sizeof(Hello)) {
        Hello h;
        std::memcpy(&h, header, sizeof(h));
        absl::MutexLock lock(&mu_);
        hello_replies_[h.cookie] = h;
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
      core_.Finish(TransferId(h.seq), code == absl::StatusCode::kOk
                                          ? absl::OkStatus()
                                          : absl::Status(code, absl::StrCat("receiver: ", msg)));
      return UCS_OK;
    }
    default:
      break;
  }
  if (header_length != sizeof(DataHeader) || conn_id == 0) {
    return UCS_OK;
  }
  DataHeader h;
  std::memcpy(&h, header, sizeof(h));
  SeqState& st = seqs_[{conn_id, h.seq}];
  if (id == kAmCancel) {
    core_.FailExpectation(h.tag, h.nonce,
                          absl::CancelledError(absl::StrCat("sender cancelled transfer tag ", h.tag,
                                                            " before completion")));
    st.failed = true;
    return UCS_OK;
  }
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

absl::StatusOr<RegionHandle> UcxTransport::Register(const MemoryRegion& region) {
  // Validate first (no UCX work for bad input), then map and pack the rkey on the loop.
  if (region.base == nullptr || region.size_bytes == 0) {
    return absl::InvalidArgumentError("register: null base or zero size");
  }
  ucp_mem_h memh = nullptr;
  std::string blob;
  ucs_status_t status = UCS_OK;
  RunSync([&] {
    ucp_mem_map_params_t mp{};
    mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
    mp.address = region.base;
    mp.length = region.size_bytes;
    status = ucp_mem_map(context_.get(), &mp, &memh);
    if (status != UCS_OK) {
      return;
    }
    void* rkey = nullptr;
    size_t rkey_len = 0;
    if (ucp_rkey_pack(context_.get(), memh, &rkey, &rkey_len) == UCS_OK) {
      transport_internal::ByteWriter w;
      w.U64(reinterpret_cast<uintptr_t>(region.base));
      w.Bytes(absl::string_view(static_cast<const char*>(rkey), rkey_len));
      blob = w.Take();
      ucp_rkey_buffer_release(rkey);
    }
  });
  if (status != UCS_OK) {
    return UcsError("ucp_mem_map", status);
  }
  absl::StatusOr<RegionHandle> h = core_.AddRegion(region, /*allow_cuda=*/false, blob);
  auto mem = std::make_unique<UcpMem>(context_.get(), memh);
  if (!h.ok()) {
    RunSync([&] { mem.reset(); });
    return h;
  }
  RunSync([&] { mems_[h->value()] = std::move(mem); });
  return h;
}

absl::Status UcxTransport::Deregister(RegionHandle region) {
  PD_RETURN_IF_ERROR(core_.RemoveRegion(region).status());
  RunSync([&] { mems_.erase(region.value()); });
  return absl::OkStatus();
}

std::string UcxTransport::LocalEndpoint() const {
  EndpointInfo e;
  e.backend = "ucx";
  e.instance_id = core_.instance_id();
  e.address = address_;
  return e.Encode();
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
  Hello reply;
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
  if (reply.version != kTransportProtocolVersion || reply.instance != e->instance_id) {
    return absl::FailedPreconditionError(
        absl::StrCat("ucx handshake: endpoint names instance ", e->instance_id, " protocol ",
                     kTransportProtocolVersion, " but ", e->address, " is instance ",
                     reply.instance, " protocol ", reply.version));
  }
  RunSync([&] {
    if (UcxConn* c = FindConn(conn_id)) {
      c->peer_instance = reply.instance;
    }
  });
  absl::MutexLock lock(&mu_);
  const uint32_t handle = next_peer_++;
  peer_conn_[handle] = conn_id;
  conn_instance_[conn_id] = reply.instance;
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
  DataHeader h{seq, post.desc.tag, post.desc.region_nonce, 0, 0};
  if (!core_.IsPending(post.id)) {
    SendAm(*conn, kAmCancel, &h, sizeof(h), nullptr, 0, 0);
    return;
  }
  conn->in_flight[seq] = h;
  const uint32_t frame_blocks =
      static_cast<uint32_t>(std::max<uint64_t>(1, kMaxFrameBytes / post.block_bytes));
  for (const BlockRun& run : post.runs) {
    for (uint32_t off = 0; off < run.num_blocks; off += frame_blocks) {
      h.dst_first = run.dst_first + off;
      h.num_blocks = std::min(frame_blocks, run.num_blocks - off);
      SendAm(*conn, kAmData, &h, sizeof(h),
             post.src_base + uint64_t{run.src_first + off} * post.block_bytes,
             uint64_t{h.num_blocks} * post.block_bytes, seq);
    }
  }
  h.dst_first = 0;
  h.num_blocks = 0;
  SendAm(*conn, kAmEnd, &h, sizeof(h), nullptr, 0, seq);
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
          DataHeader h = it->second;
          conn->in_flight.erase(it);
          SendAm(*conn, kAmCancel, &h, sizeof(h), nullptr, 0, 0);
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
