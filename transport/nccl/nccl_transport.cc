#include "transport/nccl/nccl_transport.h"

#include <cuda_runtime.h>
#include <fcntl.h>
#include <nccl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <deque>
#include <functional>
#include <optional>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "common/base/status_macros.h"
#include "common/log/log.h"
#include "transport/internal/peer_table.h"
#include "transport/internal/socket_util.h"
#include "transport/internal/transport_core.h"
#include "transport/nccl/nccl_protocol.h"

namespace pd::transport {
namespace {

using nccl_internal::Frame;
using nccl_internal::FrameType;
using nccl_internal::ReadFrame;
using nccl_internal::StatusFrame;
using nccl_internal::TransferFrame;
using nccl_internal::WriteFrame;
using transport_internal::PreparedPost;
using transport_internal::TransportCore;
using transport_internal::WriteGrant;

// Control sockets wake their threads this often to re-check whether to keep going.
constexpr absl::Duration kSocketSlice = absl::Milliseconds(50);
// The progress thread polls CUDA events this often while any group is in flight, and waits
// for work (or this long, to notice async errors and reap closed connections) otherwise.
constexpr absl::Duration kBusyPoll = absl::Microseconds(100);
constexpr absl::Duration kIdlePoll = absl::Milliseconds(50);
constexpr absl::Duration kNcclPoll = absl::Microseconds(200);

std::string NcclError(absl::string_view what, ncclResult_t r) {
  return absl::StrCat(what, ": ", ncclGetErrorString(r), " (", static_cast<int>(r), ")");
}

std::string CudaError(absl::string_view what, cudaError_t e) {
  return absl::StrCat(what, ": ", cudaGetErrorString(e));
}

// Makes `device` current on this thread for its scope and restores the caller's device (Connect
// and Register run on caller threads).
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    if (cudaGetDevice(&previous_) != cudaSuccess) {
      previous_ = -1;
    }
    ok_ = cudaSetDevice(device) == cudaSuccess;
  }
  ~DeviceGuard() {
    if (previous_ >= 0) {
      cudaSetDevice(previous_);
    }
  }
  bool ok() const { return ok_; }

 private:
  int previous_ = -1;
  bool ok_ = false;
};

// Polls a non-blocking communicator until its pending operation (init, group enqueue) left
// ncclInProgress. DeadlineExceeded when it did not by `deadline`; Unavailable for an NCCL error.
absl::Status WaitComm(ncclComm_t comm, absl::Time deadline, absl::string_view what) {
  while (true) {
    ncclResult_t state = ncclSuccess;
    const ncclResult_t r = ncclCommGetAsyncError(comm, &state);
    if (r != ncclSuccess) {
      return absl::UnavailableError(NcclError(absl::StrCat(what, ": ncclCommGetAsyncError"), r));
    }
    if (state == ncclSuccess) {
      return absl::OkStatus();
    }
    if (state != ncclInProgress) {
      return absl::UnavailableError(NcclError(what, state));
    }
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat(what, ": still in progress at its deadline"));
    }
    absl::SleepFor(kNcclPoll);
  }
}

// One NCCL group in flight: a sender's sends or a receiver's recvs of one transfer.
struct Op {
  uint64_t seq = 0;  // the sender's transfer id
  cudaEvent_t event = nullptr;
  uint64_t src_region = 0;  // sender: the pinned source region
  uint64_t tag = 0;         // receiver
  uint64_t nonce = 0;       // receiver
  std::vector<WriteGrant> grants;
};

// A transfer the sender announced and the receiver has not answered yet.
struct AwaitingGo {
  PreparedPost post;
  uint64_t src_region = 0;
};

// One control connection and its communicator. Outbound (we connected: rank 0, we send) or
// inbound (rank 1, we receive).
struct Conn {
  uint64_t id = 0;
  bool outbound = false;
  int fd = -1;
  std::atomic<uint64_t> peer_instance{0};  // set by the handshake
  std::atomic<bool> dead{false};           // no new work; set before the communicator is aborted
  std::atomic<bool> reader_done{false};    // the reader thread is about to return
  std::thread reader;
  cudaStream_t stream = nullptr;  // created with the communicator, destroyed when reaped
  absl::Mutex write_mu;           // serializes frame writes on fd
  // Guards the communicator (every NCCL call on it, event queries against abort) and the op
  // lists. Lock order: mu -> write_mu, mu -> the core's mutex.
  absl::Mutex mu;
  ncclComm_t comm ABSL_GUARDED_BY(mu) = nullptr;
  bool aborted ABSL_GUARDED_BY(mu) = false;
  absl::Status death ABSL_GUARDED_BY(mu);
  std::deque<Op> issued ABSL_GUARDED_BY(mu);  // retired by the progress thread
  absl::flat_hash_map<uint64_t, AwaitingGo> awaiting_go ABSL_GUARDED_BY(mu);

  ~Conn() {
    if (fd >= 0) {
      ::close(fd);
    }
  }
};

class NcclTransport : public transport_internal::CoreBackedTransport {
 public:
  NcclTransport(NcclTransportOptions options, int listen_fd, std::string address)
      : CoreBackedTransport("nccl", std::move(address)),
        options_(std::move(options)),
        listen_fd_(listen_fd) {
    acceptor_ = std::thread([this] { AcceptLoop(); });
    progress_ = std::thread([this] { ProgressLoop(); });
  }
  ~NcclTransport() override;

  TransportCaps Caps() const override {
    TransportCaps c;
    c.cuda_memory = true;
    c.two_sided = true;
    c.notifications = true;
    c.cancel = false;  // receiver expectations only; see Cancel
    return c;
  }

  absl::StatusOr<RegionHandle> Register(const MemoryRegion& region) override;
  absl::Status Deregister(RegionHandle region) override;
  absl::StatusOr<PeerHandle> Connect(absl::string_view endpoint) override;
  absl::Status Disconnect(PeerHandle peer) override;
  absl::StatusOr<TransferId> PostTransfer(PeerHandle peer, uint64_t tag, RegionHandle src,
                                          absl::Span<const BlockPair> pairs,
                                          absl::string_view remote_descriptor,
                                          const TransferOptions& options) override;
  absl::Status Cancel(TransferId id) override;

 private:
  bool Running() const { return !stopping_.load(std::memory_order_relaxed); }
  absl::Status InitComm(Conn& conn, const ncclUniqueId& uid, int rank, absl::Time deadline);
  // Issues one NCCL group on the connection's stream — sends of `buffers` to rank 1, or
  // receives into them from rank 0 — and records `*event` after it. `after_enqueue` runs
  // between ncclGroupEnd and the wait for the enqueue (the receiver sends GO there). On error
  // the group may be half-issued: the caller aborts the connection.
  struct Buffer {
    void* data = nullptr;
    uint64_t bytes = 0;
  };
  absl::Status IssueGroupLocked(Conn& conn, bool send, const std::vector<Buffer>& buffers,
                                const std::function<absl::Status()>& after_enqueue,
                                cudaEvent_t* event) ABSL_EXCLUSIVE_LOCKS_REQUIRED(conn.mu);
  absl::Status SendFrame(Conn& conn, FrameType type, absl::string_view body);
  // Aborts the communicator (ending its in-flight groups), closes the control connection and
  // fails what waits for an answer. `drain_stream`: also wait for the stream to stop before
  // releasing the unanswered transfers' pins (after a half-issued group).
  void AbortConn(Conn& conn, const absl::Status& why, bool drain_stream = false);
  void AddConn(const std::shared_ptr<Conn>& conn) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Unpin(uint64_t region);
  void WakeProgress();

  void AcceptLoop();
  void InboundLoop(std::shared_ptr<Conn> conn);
  absl::Status InboundHandshake(Conn& conn);
  // Connector side: HELLO exchange, unique id, communicator (rank 0), READY.
  absl::Status ClientHandshake(Conn& conn, const EndpointInfo& e);
  bool HandleTransfer(Conn& conn, const TransferFrame& frame);
  void OutboundLoop(std::shared_ptr<Conn> conn);
  bool HandleGo(Conn& conn, uint64_t seq);

  void ProgressLoop();
  bool ProgressConn(Conn& conn);  // returns whether ops remain in flight
  // Non-OK when a pending group's transfer already failed (sender) or its expectation ended
  // (receiver). Requires conn.mu.
  absl::Status OutlivedItsTransfer(const Conn& conn, const Op& op);
  // Completes finished groups: a receiver's ok group completes its expectation and answers
  // DONE; failed ones fail with `death`; a sender's releases its pin.
  void RetireOps(Conn& conn, std::vector<Op>& ok_ops, std::vector<Op>& failed_ops,
                 const absl::Status& death);
  void Reap();

  const NcclTransportOptions options_;
  const int listen_fd_;
  std::atomic<bool> stopping_{false};
  std::thread acceptor_;
  std::thread progress_;

  absl::Mutex mu_;
  uint64_t next_conn_ ABSL_GUARDED_BY(mu_) = 1;
  absl::flat_hash_map<uint64_t, std::shared_ptr<Conn>> conns_ ABSL_GUARDED_BY(mu_);
  transport_internal::PeerTable<std::shared_ptr<Conn>> peers_ ABSL_GUARDED_BY(mu_);
  // Source regions read by posted transfers that are not retired yet; Deregister waits.
  absl::flat_hash_map<uint64_t, int> pins_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_set<uint64_t> posted_ ABSL_GUARDED_BY(mu_);  // sender transfers in flight
  bool work_ ABSL_GUARDED_BY(mu_) = false;                     // wakes the progress thread
};

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

absl::Status NcclTransport::SendFrame(Conn& conn, FrameType type, absl::string_view body) {
  absl::MutexLock lock(&conn.write_mu);
  return WriteFrame(conn.fd, type, body, absl::Now() + options_.connect_timeout);
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

absl::Status NcclTransport::InitComm(Conn& conn, const ncclUniqueId& uid, int rank,
                                     absl::Time deadline) {
  DeviceGuard device(options_.device);
  if (!device.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("nccl: cannot make cuda device ", options_.device, " current"));
  }
  cudaError_t ce = cudaStreamCreateWithFlags(&conn.stream, cudaStreamNonBlocking);
  if (ce != cudaSuccess) {
    conn.stream = nullptr;
    return absl::InternalError(CudaError("nccl: cudaStreamCreate", ce));
  }
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;  // creation and enqueues return ncclInProgress; we poll with a deadline
  ncclComm_t comm = nullptr;
  const ncclResult_t r = ncclCommInitRankConfig(&comm, 2, uid, rank, &config);
  absl::Status s;
  if (r != ncclSuccess && r != ncclInProgress) {
    s = absl::UnavailableError(NcclError("ncclCommInitRankConfig", r));
  } else {
    s = WaitComm(comm, deadline, absl::StrCat("nccl communicator (rank ", rank, ")"));
  }
  if (!s.ok()) {
    if (comm != nullptr) {
      ncclCommAbort(comm);
    }
    return s;
  }
  absl::MutexLock lock(&conn.mu);
  conn.comm = comm;
  return absl::OkStatus();
}

absl::Status NcclTransport::IssueGroupLocked(Conn& conn, bool send,
                                             const std::vector<Buffer>& buffers,
                                             const std::function<absl::Status()>& after_enqueue,
                                             cudaEvent_t* event) {
  const char* what = send ? "ncclSend" : "ncclRecv";
  ncclResult_t r = ncclGroupStart();
  for (const Buffer& b : buffers) {
    if (r != ncclSuccess && r != ncclInProgress) {
      break;
    }
    r = send ? ncclSend(b.data, b.bytes, ncclUint8, /*peer=*/1, conn.comm, conn.stream)
             : ncclRecv(b.data, b.bytes, ncclUint8, /*peer=*/0, conn.comm, conn.stream);
  }
  const ncclResult_t end = ncclGroupEnd();
  if (r != ncclSuccess && r != ncclInProgress) {
    return absl::UnavailableError(NcclError(what, r));
  }
  if (end != ncclSuccess && end != ncclInProgress) {
    return absl::UnavailableError(NcclError(absl::StrCat("ncclGroupEnd (", what, ")"), end));
  }
  if (after_enqueue) {
    PD_RETURN_IF_ERROR(after_enqueue());
  }
  // Non-blocking communicator: no other NCCL call, and no stream work, until the enqueue left
  // ncclInProgress.
  PD_RETURN_IF_ERROR(
      WaitComm(conn.comm, absl::Now() + options_.connect_timeout, absl::StrCat(what, " enqueue")));
  cudaError_t ce = cudaEventCreateWithFlags(event, cudaEventDisableTiming);
  if (ce != cudaSuccess) {
    *event = nullptr;
    return absl::InternalError(CudaError("cudaEventCreate", ce));
  }
  ce = cudaEventRecord(*event, conn.stream);
  if (ce != cudaSuccess) {
    cudaEventDestroy(*event);
    *event = nullptr;
    return absl::InternalError(CudaError("cudaEventRecord", ce));
  }
  return absl::OkStatus();
}

void NcclTransport::AbortConn(Conn& conn, const absl::Status& why, bool drain_stream) {
  std::vector<AwaitingGo> unanswered;
  bool busy = false;
  {
    absl::ReleasableMutexLock lock(&conn.mu);
    conn.dead.store(true);
    if (conn.aborted) {
      lock.Release();
      // Someone else aborted; the caller may still need the stream stopped before it releases
      // what a half-issued group referenced.
      if (drain_stream && conn.stream != nullptr) {
        DeviceGuard device(options_.device);
        cudaStreamSynchronize(conn.stream);
      }
      return;
    }
    busy = !conn.issued.empty() || !conn.awaiting_go.empty();
    conn.aborted = true;
    conn.death = why;
    if (conn.comm != nullptr) {
      // Ends the in-flight groups on the stream; the progress thread retires them as failed.
      DeviceGuard device(options_.device);
      const ncclResult_t r = ncclCommAbort(conn.comm);
      if (r != ncclSuccess) {
        LOG(WARNING) << NcclError("ncclCommAbort", r);
      }
      conn.comm = nullptr;
    }
    for (auto& [seq, a] : conn.awaiting_go) {
      unanswered.push_back(std::move(a));
    }
    conn.awaiting_go.clear();
  }
  ::shutdown(conn.fd, SHUT_RDWR);
  if (drain_stream && conn.stream != nullptr) {
    DeviceGuard device(options_.device);
    cudaStreamSynchronize(conn.stream);
  }
  if (busy && Running()) {
    LOG(WARNING) << "nccl transport: connection to instance " << conn.peer_instance
                 << " aborted with transfers in flight: " << why;
  } else if (conn.peer_instance != 0 && Running()) {
    LOG(INFO) << "nccl transport: instance " << conn.peer_instance << " left: " << why;
  }
  for (AwaitingGo& a : unanswered) {
    core_.Finish(a.post.id, why);
    Unpin(a.src_region);
    absl::MutexLock lock(&mu_);
    posted_.erase(a.post.id.value());
  }
  if (!conn.outbound) {
    core_.FailExpectationsFromSource(conn.id, why);
  }
  WakeProgress();
}

// ---- receiver side

void NcclTransport::AcceptLoop() {
  while (Running()) {
    const int fd = transport_internal::AcceptTcp(listen_fd_, kSocketSlice);
    if (fd < 0) {
      continue;
    }
    auto conn = std::make_shared<Conn>();
    conn->fd = fd;
    absl::MutexLock lock(&mu_);
    if (!Running()) {
      return;
    }
    conn->id = (uint64_t{1} << 63) | next_conn_++;
    AddConn(conn);
    conn->reader = std::thread([this, conn] { InboundLoop(conn); });
  }
}

absl::Status NcclTransport::InboundHandshake(Conn& conn) {
  const absl::Time deadline = absl::Now() + options_.connect_timeout;
  auto keep_going = [this] { return Running(); };
  absl::StatusOr<Frame> f = ReadFrame(conn.fd, deadline, keep_going);
  if (!f.ok()) {
    return f.status();
  }
  absl::StatusOr<nccl_internal::HelloFrame> hello =
      f->type == FrameType::kHello ? nccl_internal::DecodeHello(f->body)
                                   : absl::InvalidArgumentError("expected a hello frame");
  if (!hello.ok()) {
    return hello.status();
  }
  conn.peer_instance = hello->instance_id;
  nccl_internal::HelloFrame reply;
  reply.instance_id = core_.instance_id();
  absl::Status s = SendFrame(conn, FrameType::kHello, nccl_internal::EncodeHello(reply));
  if (!s.ok() || hello->protocol_version != kTransportProtocolVersion ||
      hello->expected_instance_id != core_.instance_id()) {
    return s.ok() ? absl::FailedPreconditionError("nccl hello: version or instance mismatch") : s;
  }
  f = ReadFrame(conn.fd, deadline, keep_going);
  if (!f.ok()) {
    return f.status();
  }
  if (f->type != FrameType::kUniqueId || f->body.size() != sizeof(ncclUniqueId)) {
    return absl::InvalidArgumentError("nccl handshake: expected a unique id frame");
  }
  ncclUniqueId uid;
  std::memcpy(&uid, f->body.data(), sizeof(uid));
  s = InitComm(conn, uid, /*rank=*/1, deadline);
  absl::Status sent =
      SendFrame(conn, FrameType::kReady, nccl_internal::EncodeStatus(StatusFrame{0, s}));
  return s.ok() ? sent : s;
}

void NcclTransport::InboundLoop(std::shared_ptr<Conn> conn) {
  cudaSetDevice(options_.device);
  absl::Status s = InboundHandshake(*conn);
  if (s.ok()) {
    VLOG(1) << "nccl transport: instance " << conn->peer_instance << " connected";
  }
  auto keep_going = [this, &conn] { return Running() && !conn->dead.load(); };
  while (s.ok()) {
    absl::StatusOr<Frame> f = ReadFrame(conn->fd, absl::InfiniteFuture(), keep_going);
    if (!f.ok()) {
      s = f.status();
      break;
    }
    if (f->type != FrameType::kTransfer) {
      s = absl::InvalidArgumentError(absl::StrCat("nccl receiver: unexpected ",
                                                  nccl_internal::FrameTypeName(f->type), " frame"));
      break;
    }
    absl::StatusOr<TransferFrame> t = nccl_internal::DecodeTransfer(f->body);
    if (!t.ok()) {
      s = t.status();
      break;
    }
    if (!HandleTransfer(*conn, *t)) {
      s = absl::UnavailableError("nccl receiver: connection aborted");
      break;
    }
  }
  AbortConn(*conn, absl::UnavailableError(
                       absl::StrCat("nccl connection from instance ", conn->peer_instance.load(),
                                    " closed mid-transfer (peer died?): ", s.message())));
  conn->reader_done.store(true);
}

// Returns false when the connection must close.
bool NcclTransport::HandleTransfer(Conn& conn, const TransferFrame& frame) {
  absl::StatusOr<std::vector<WriteGrant>> grants =
      nccl_internal::AcquireGrants(core_, frame, conn.id);
  if (!grants.ok()) {
    VLOG(2) << "nccl receiver: rejects transfer tag " << frame.tag << ": " << grants.status();
    return SendFrame(conn, FrameType::kReject,
                     nccl_internal::EncodeStatus(StatusFrame{frame.seq, grants.status()}))
        .ok();
  }
  Op op;
  op.seq = frame.seq;
  op.tag = frame.tag;
  op.nonce = frame.nonce;
  op.grants = *std::move(grants);
  absl::Status s;
  {
    absl::MutexLock lock(&conn.mu);
    if (conn.aborted || conn.comm == nullptr) {
      s = absl::UnavailableError("nccl connection aborted");
    } else {
      // Receives are issued in frame order, and GO follows from this thread: the sender
      // issues its sends in GO order, so both sides' groups line up (nccl_protocol.h). GO
      // goes before the wait: the first group's connection setup needs the sender's sends.
      std::vector<Buffer> buffers;
      for (const WriteGrant& g : op.grants) {
        buffers.push_back({g.dst, g.length});
      }
      s = IssueGroupLocked(
          conn, /*send=*/false, buffers,
          [&] {
            return SendFrame(conn, FrameType::kGo,
                             nccl_internal::EncodeStatus(StatusFrame{frame.seq, absl::OkStatus()}));
          },
          &op.event);
      if (s.ok()) {
        conn.issued.push_back(std::move(op));
      }
    }
  }
  if (!s.ok()) {
    // The group may be half-issued: only an abort brings both sides back to a known state.
    // The grants end once the aborted kernels stopped writing.
    AbortConn(conn, s, /*drain_stream=*/true);
    for (const WriteGrant& g : op.grants) {
      core_.EndWrite(g, false, s);
    }
    return false;
  }
  WakeProgress();
  return true;
}

// ---- sender side

absl::StatusOr<PeerHandle> NcclTransport::Connect(absl::string_view endpoint) {
  PD_ASSIGN_OR_RETURN(const EndpointInfo e,
                      transport_internal::DecodePeerEndpoint("nccl", endpoint));
  {
    absl::MutexLock lock(&mu_);
    std::optional<PeerHandle> live = peers_.FindIf([&](const std::shared_ptr<Conn>& c) {
      return c->peer_instance == e.instance_id && !c->dead.load();
    });
    if (live.has_value()) {
      return *live;
    }
  }
  PD_ASSIGN_OR_RETURN(const int fd,
                      transport_internal::DialTcp(e.address, options_.connect_timeout, "nccl"));
  transport_internal::SetStreamSocketOptions(fd, kSocketSlice);
  auto conn = std::make_shared<Conn>();
  conn->fd = fd;
  conn->outbound = true;
  absl::Status s = ClientHandshake(*conn, e);
  PeerHandle handle;
  if (s.ok()) {
    // Checked under mu_: the destructor sets stopping_ under mu_, then aborts what is in
    // conns_, so a connection is either added before (and aborted with the rest) or not at all.
    absl::MutexLock lock(&mu_);
    if (Running()) {
      conn->id = next_conn_++;
      AddConn(conn);
      handle = peers_.Add(conn);
      conn->reader = std::thread([this, conn] { OutboundLoop(conn); });
    } else {
      s = absl::UnavailableError("nccl transport is shutting down");
    }
  }
  if (!s.ok()) {
    AbortConn(*conn, s);
    if (conn->stream != nullptr) {
      DeviceGuard device(options_.device);
      cudaStreamDestroy(conn->stream);
      conn->stream = nullptr;
    }
    return s;
  }
  VLOG(1) << "nccl transport connected to " << e.address << " instance " << e.instance_id;
  return handle;
}

absl::Status NcclTransport::ClientHandshake(Conn& conn, const EndpointInfo& e) {
  const absl::Time deadline = absl::Now() + options_.connect_timeout;
  nccl_internal::HelloFrame hello;
  hello.instance_id = core_.instance_id();
  hello.expected_instance_id = e.instance_id;
  absl::Status s = SendFrame(conn, FrameType::kHello, nccl_internal::EncodeHello(hello));
  absl::StatusOr<Frame> f = s.ok() ? ReadFrame(conn.fd, deadline, nullptr) : s;
  absl::StatusOr<nccl_internal::HelloFrame> reply =
      !f.ok()                        ? f.status()
      : f->type == FrameType::kHello ? nccl_internal::DecodeHello(f->body)
                                     : absl::InvalidArgumentError("expected a hello frame");
  if (!reply.ok()) {
    return absl::UnavailableError(
        absl::StrCat("nccl handshake with ", e.address, " failed: ", reply.status().message()));
  }
  if (reply->protocol_version != kTransportProtocolVersion) {
    return absl::FailedPreconditionError(
        absl::StrCat("nccl protocol version mismatch: local=", kTransportProtocolVersion,
                     " remote=", reply->protocol_version));
  }
  if (reply->instance_id != e.instance_id) {
    return absl::FailedPreconditionError(absl::StrCat(
        "endpoint names transport instance ", e.instance_id, " but ", e.address, " is instance ",
        reply->instance_id, " (peer restarted? fetch its new endpoint)"));
  }
  conn.peer_instance = reply->instance_id;
  ncclUniqueId uid;
  {
    DeviceGuard device(options_.device);
    const ncclResult_t r = ncclGetUniqueId(&uid);
    if (r != ncclSuccess) {
      return absl::UnavailableError(NcclError("ncclGetUniqueId", r));
    }
  }
  s = SendFrame(conn, FrameType::kUniqueId,
                absl::string_view(reinterpret_cast<const char*>(&uid), sizeof(uid)));
  if (s.ok()) {
    s = InitComm(conn, uid, /*rank=*/0, deadline);
  }
  if (s.ok()) {
    f = ReadFrame(conn.fd, deadline, nullptr);
    absl::StatusOr<StatusFrame> ready = !f.ok() ? f.status()
                                        : f->type == FrameType::kReady
                                            ? nccl_internal::DecodeStatus(f->body)
                                            : absl::InvalidArgumentError("expected a ready frame");
    s = ready.ok() ? ready->status : ready.status();
  }
  if (!s.ok()) {
    return absl::UnavailableError(
        absl::StrCat("nccl connect to ", e.address, ": communicator not created: ", s.message()));
  }
  return absl::OkStatus();
}

absl::Status NcclTransport::Disconnect(PeerHandle handle) {
  std::shared_ptr<Conn> conn;
  {
    absl::MutexLock lock(&mu_);
    PD_ASSIGN_OR_RETURN(conn, peers_.Remove(handle));
  }
  AbortConn(*conn, absl::CancelledError(absl::StrCat("peer ", handle.value(), " disconnected")));
  return absl::OkStatus();
}

absl::StatusOr<TransferId> NcclTransport::PostTransfer(PeerHandle handle, uint64_t tag,
                                                       RegionHandle src,
                                                       absl::Span<const BlockPair> pairs,
                                                       absl::string_view remote_descriptor,
                                                       const TransferOptions& options) {
  std::shared_ptr<Conn> conn;
  {
    absl::MutexLock lock(&mu_);
    PD_ASSIGN_OR_RETURN(conn, peers_.Get(handle, "post"));
    ++pins_[src.value()];  // before PreparePost: a racing Deregister then waits for us
  }
  if (conn->dead.load()) {
    Unpin(src.value());
    return transport_internal::ClosedPeerError(handle);
  }
  absl::StatusOr<PreparedPost> post =
      core_.PreparePost(conn->peer_instance, tag, src, pairs, remote_descriptor, options);
  if (!post.ok()) {
    Unpin(src.value());
    return post.status();
  }
  const TransferId id = post->id;
  const std::string body = nccl_internal::EncodeTransfer(nccl_internal::MakeTransferFrame(*post));
  {
    absl::MutexLock lock(&mu_);
    posted_.insert(id.value());
  }
  // Once in awaiting_go, the transfer is retired by GO/REJECT handling or by AbortConn (which
  // fails and unpins everything there); otherwise it is failed here.
  bool queued = false;
  {
    absl::MutexLock lock(&conn->mu);
    if (!conn->aborted) {
      conn->awaiting_go[id.value()] = AwaitingGo{*std::move(post), src.value()};
      queued = true;
    }
  }
  absl::Status s = queued ? SendFrame(*conn, FrameType::kTransfer, body) : absl::OkStatus();
  if (!s.ok()) {
    AbortConn(*conn, absl::UnavailableError(absl::StrCat("nccl control connection to instance ",
                                                         conn->peer_instance.load(),
                                                         " broke: ", s.message())));
  }
  if (!queued) {
    core_.Finish(id, absl::UnavailableError("nccl connection aborted"));
    Unpin(src.value());
    absl::MutexLock lock(&mu_);
    posted_.erase(id.value());
  }
  WakeProgress();
  return id;
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

void NcclTransport::OutboundLoop(std::shared_ptr<Conn> conn) {
  cudaSetDevice(options_.device);
  auto keep_going = [this, &conn] { return Running() && !conn->dead.load(); };
  absl::Status s;
  while (true) {
    absl::StatusOr<Frame> f = ReadFrame(conn->fd, absl::InfiniteFuture(), keep_going);
    if (!f.ok()) {
      s = f.status();
      break;
    }
    absl::StatusOr<StatusFrame> st = nccl_internal::DecodeStatus(f->body);
    if (!st.ok()) {
      s = st.status();
      break;
    }
    if (f->type == FrameType::kGo) {
      if (!HandleGo(*conn, st->seq)) {
        s = absl::UnavailableError("nccl send group failed");
        break;
      }
    } else if (f->type == FrameType::kReject || f->type == FrameType::kDone) {
      std::optional<AwaitingGo> rejected;
      if (f->type == FrameType::kReject) {
        absl::MutexLock lock(&conn->mu);
        auto it = conn->awaiting_go.find(st->seq);
        if (it != conn->awaiting_go.end()) {
          rejected = std::move(it->second);
          conn->awaiting_go.erase(it);
        }
      }
      absl::Status result =
          st->status.ok()
              ? st->status
              : absl::Status(st->status.code(), absl::StrCat("receiver: ", st->status.message()));
      if (f->type == FrameType::kReject && result.ok()) {
        result = absl::UnknownError("receiver rejected the transfer without a reason");
      }
      core_.Finish(TransferId(st->seq), result);
      if (rejected.has_value()) {
        Unpin(rejected->src_region);
        absl::MutexLock lock(&mu_);
        posted_.erase(st->seq);
      }
    } else {
      s = absl::InvalidArgumentError(absl::StrCat("nccl sender: unexpected ",
                                                  nccl_internal::FrameTypeName(f->type), " frame"));
      break;
    }
  }
  AbortConn(*conn, absl::UnavailableError(absl::StrCat(
                       "nccl connection to instance ", conn->peer_instance.load(),
                       " closed before the transfer completed (peer died?): ", s.message())));
  conn->reader_done.store(true);
}

// Returns false when the connection must close.
bool NcclTransport::HandleGo(Conn& conn, uint64_t seq) {
  absl::Status s;
  {
    absl::MutexLock lock(&conn.mu);
    auto it = conn.awaiting_go.find(seq);
    if (it == conn.awaiting_go.end() || conn.aborted || conn.comm == nullptr) {
      // The receiver posted receives we cannot match: only an abort restores order.
      s = absl::InternalError(absl::StrCat("nccl sender: go for unknown transfer ", seq));
    } else {
      AwaitingGo a = std::move(it->second);
      conn.awaiting_go.erase(it);
      Op op;
      op.seq = seq;
      op.src_region = a.src_region;
      const PreparedPost& post = a.post;
      // Issued even if the transfer timed out meanwhile: the receiver's receives are posted
      // and the source region is pinned, so sending keeps both sides in step.
      std::vector<Buffer> buffers;
      for (const BlockRun& run : post.runs) {
        buffers.push_back(
            {const_cast<char*>(post.src_base) + uint64_t{run.src_first} * post.block_bytes,
             uint64_t{run.num_blocks} * post.block_bytes});
      }
      s = IssueGroupLocked(conn, /*send=*/true, buffers, nullptr, &op.event);
      if (s.ok()) {
        conn.issued.push_back(std::move(op));
      } else {
        // Put it back: the abort below fails and unpins it with everything else, after the
        // aborted kernels stopped reading.
        conn.awaiting_go[seq] = std::move(a);
      }
    }
  }
  if (!s.ok()) {
    LOG(WARNING) << "nccl sender: " << s;
    // Ends half-issued kernels and drains the stream before the pins go.
    AbortConn(conn, s, /*drain_stream=*/true);
    return false;
  }
  WakeProgress();
  return true;
}

// ---- progress

bool NcclTransport::ProgressConn(Conn& conn) {
  std::vector<Op> ok_ops;
  std::vector<Op> failed_ops;
  absl::Status death;
  absl::Status stale;  // set when the connection must be aborted
  bool remaining = false;
  {
    absl::MutexLock lock(&conn.mu);
    death = conn.death;
    if (!conn.aborted && conn.comm != nullptr) {
      ncclResult_t state = ncclSuccess;
      if (ncclCommGetAsyncError(conn.comm, &state) != ncclSuccess ||
          (state != ncclSuccess && state != ncclInProgress)) {
        stale = absl::UnavailableError(NcclError("nccl communicator async error", state));
      }
    }
    if (conn.outbound && !conn.aborted && stale.ok()) {
      for (const auto& [seq, a] : conn.awaiting_go) {
        absl::StatusOr<TransferState> st = core_.Poll(TransferId(seq));
        if (st.ok() && st->phase == TransferPhase::kFailed) {
          // The receiver did not answer in time. Its GO may still come, with receives posted
          // that nothing would match: abort instead of guessing.
          stale = absl::UnavailableError(absl::StrCat("nccl receiver did not answer transfer ", seq,
                                                      " (", st->status.message(),
                                                      "); connection aborted"));
          break;
        }
      }
    }
    for (auto it = conn.issued.begin(); it != conn.issued.end();) {
      const cudaError_t e = cudaEventQuery(it->event);
      if (e == cudaErrorNotReady) {
        if (!conn.aborted && stale.ok()) {
          stale = OutlivedItsTransfer(conn, *it);
        }
        ++it;
        continue;
      }
      cudaGetLastError();  // an error here is reported through the op, not left sticky
      // Under mu: an event that completed while the connection was not aborted completed
      // because the group finished, not because an abort cut it short.
      if (e == cudaSuccess && !conn.aborted) {
        ok_ops.push_back(std::move(*it));
      } else {
        if (e != cudaSuccess && stale.ok() && !conn.aborted) {
          stale = absl::InternalError(CudaError("nccl group failed", e));
        }
        failed_ops.push_back(std::move(*it));
      }
      it = conn.issued.erase(it);
    }
    remaining = !conn.issued.empty();
  }
  if (!stale.ok()) {
    AbortConn(conn, stale);
    remaining = true;  // come back for the aborted groups
    absl::MutexLock lock(&conn.mu);
    death = conn.death;
  }
  if (death.ok()) {
    death = absl::UnavailableError("nccl connection aborted");
  }
  RetireOps(conn, ok_ops, failed_ops, death);
  return remaining;
}

absl::Status NcclTransport::OutlivedItsTransfer(const Conn& conn, const Op& op) {
  // An issued group that outlived its transfer: NCCL cannot cancel it, so the caller aborts.
  if (conn.outbound) {
    absl::StatusOr<TransferState> st = core_.Poll(TransferId(op.seq));
    if (st.ok() && st->phase == TransferPhase::kFailed) {
      return absl::UnavailableError(absl::StrCat("nccl send of transfer ", op.seq,
                                                 " still in flight after it failed (",
                                                 st->status.message(), "); connection aborted"));
    }
    return absl::OkStatus();
  }
  for (const WriteGrant& g : op.grants) {
    core_.IsPending(g.exp->id);  // applies the expectation's deadline
    if (!g.Valid()) {
      return absl::UnavailableError(absl::StrCat("nccl receive for tag ", op.tag,
                                                 " still in flight after its expectation ended; "
                                                 "connection aborted"));
    }
  }
  return absl::OkStatus();
}

void NcclTransport::RetireOps(Conn& conn, std::vector<Op>& ok_ops, std::vector<Op>& failed_ops,
                              const absl::Status& death) {
  for (Op& op : ok_ops) {
    cudaEventDestroy(op.event);
    if (conn.outbound) {
      // The transfer itself completes on the receiver's DONE (every byte in place there).
      Unpin(op.src_region);
      absl::MutexLock lock(&mu_);
      posted_.erase(op.seq);
      continue;
    }
    for (const WriteGrant& g : op.grants) {
      core_.EndWrite(g, true);
    }
    absl::Status s = core_.CompleteExpectation(op.tag, op.nonce);
    VLOG(2) << "nccl receiver: transfer tag " << op.tag << " arrived: " << s;
    if (!SendFrame(conn, FrameType::kDone, nccl_internal::EncodeStatus(StatusFrame{op.seq, s}))
             .ok()) {
      AbortConn(conn, absl::UnavailableError("nccl control connection broke"));
    }
  }
  for (Op& op : failed_ops) {
    cudaEventDestroy(op.event);
    if (conn.outbound) {
      core_.Finish(TransferId(op.seq), death);
      Unpin(op.src_region);
      absl::MutexLock lock(&mu_);
      posted_.erase(op.seq);
    } else {
      for (const WriteGrant& g : op.grants) {
        core_.EndWrite(g, false, death);
      }
    }
  }
}

void NcclTransport::Reap() {
  std::vector<std::shared_ptr<Conn>> gone;
  {
    absl::MutexLock lock(&mu_);
    for (auto it = conns_.begin(); it != conns_.end();) {
      Conn& c = *it->second;
      bool idle = false;
      if (c.dead.load() && c.reader_done.load()) {
        absl::MutexLock conn_lock(&c.mu);
        idle = c.issued.empty() && c.awaiting_go.empty();
      }
      if (idle) {
        gone.push_back(it->second);
        conns_.erase(it++);
      } else {
        ++it;
      }
    }
  }
  for (auto& c : gone) {
    if (c->reader.joinable()) {
      c->reader.join();
    }
    if (c->stream != nullptr) {
      cudaStreamDestroy(c->stream);
      c->stream = nullptr;
    }
  }
}

void NcclTransport::ProgressLoop() {
  cudaSetDevice(options_.device);
  while (true) {
    std::vector<std::shared_ptr<Conn>> conns;
    {
      absl::MutexLock lock(&mu_);
      work_ = false;
      for (auto& [id, c] : conns_) {
        conns.push_back(c);
      }
    }
    bool busy = false;
    for (auto& c : conns) {
      busy |= ProgressConn(*c);
    }
    Reap();
    if (!Running()) {
      absl::MutexLock lock(&mu_);
      if (conns_.empty()) {
        return;
      }
    }
    if (busy) {
      absl::SleepFor(kBusyPoll);
    } else {
      absl::MutexLock lock(&mu_);
      mu_.AwaitWithTimeout(absl::Condition(&work_), kIdlePoll);
    }
  }
}

}  // namespace

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
      new NcclTransport(options, listener.fd, std::move(listener.address)));
}

}  // namespace pd::transport
