#include "transport/tcp/tcp_transport.h"

#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cstring>
#include <deque>
#include <optional>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/functional/function_ref.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/base/status_macros.h"
#include "common/log/log.h"
#include "transport/internal/peer_table.h"
#include "transport/internal/socket_io.h"
#include "transport/internal/socket_util.h"
#include "transport/internal/transport_core.h"

namespace pd::transport {
namespace {

using transport_internal::PreparedPost;
using transport_internal::ReadFull;
using transport_internal::SocketIo;
using transport_internal::TransportCore;
using transport_internal::WriteGrant;

constexpr uint32_t kFrameMagic = 0x46544450;  // "PDTF"
// Connected sockets wake their threads this often to re-check whether to keep going.
constexpr absl::Duration kPollSlice = absl::Milliseconds(50);
constexpr uint64_t kIoChunkBytes = 1 << 20;
constexpr uint64_t kMaxDrainBytes = uint64_t{1} << 34;  // larger frames close the connection

enum FrameType : uint32_t {
  kHello = 1,   // tag = instance id
  kData = 2,    // seq, tag, nonce, dst_first, num_blocks, length + payload
  kEnd = 3,     // seq, tag, nonce: all data of seq was sent
  kCancel = 4,  // tag, nonce: the sender gave up
  kAck = 5,     // seq: receiver has every block
  kError = 6,   // seq, dst_first = status code, length + message
};

struct FrameHeader {
  uint32_t magic = kFrameMagic;
  uint32_t type = 0;
  uint64_t seq = 0;
  uint64_t tag = 0;
  uint64_t nonce = 0;
  uint32_t dst_first = 0;
  uint32_t num_blocks = 0;
  uint64_t length = 0;
};
static_assert(sizeof(FrameHeader) == 48);

// Writes all of `iov`; keep_going() is asked after a whole slice without progress.
absl::Status SendAll(int fd, std::vector<iovec> iov, absl::FunctionRef<bool()> keep_going) {
  int error = 0;
  switch (transport_internal::WriteAll(fd, std::move(iov), keep_going, &error)) {
    case SocketIo::kOk:
      return absl::OkStatus();
    case SocketIo::kStopped:
      return absl::DeadlineExceededError("tcp send stalled after the transfer ended");
    case SocketIo::kClosed:
    case SocketIo::kFailed:
      break;
  }
  return absl::UnavailableError(absl::StrCat("tcp send: ", std::strerror(error)));
}

// One TCP connection and its reader thread. Outbound connections belong to a Peer (which
// also runs a sender thread); inbound ones only receive data and send ACK/ERROR.
struct Conn {
  uint64_t id = 0;
  int fd = -1;
  uint64_t peer_instance = 0;
  std::atomic<bool> dead{false};
  std::atomic<bool> finished{false};  // inbound reader is about to return
  absl::Mutex write_mu;               // serializes frame writes
  std::thread reader;
  ~Conn() {
    if (fd >= 0) {
      ::close(fd);
    }
  }
};

class TcpTransport : public transport_internal::CoreBackedTransport {
 public:
  TcpTransport(TcpTransportOptions options, int listen_fd, std::string address)
      : CoreBackedTransport("tcp", std::move(address)),
        options_(std::move(options)),
        listen_fd_(listen_fd) {
    acceptor_ = std::thread([this] { AcceptLoop(); });
  }

  ~TcpTransport() override {
    std::vector<std::shared_ptr<Conn>> conns;
    std::vector<std::shared_ptr<Peer>> peers;
    {
      absl::MutexLock lock(&mu_);
      stopping_.store(true);
      for (auto& [id, c] : inbound_) {
        conns.push_back(c);
      }
      peers = peers_.Values();
    }
    for (auto& c : conns) {
      ::shutdown(c->fd, SHUT_RDWR);
    }
    for (auto& p : peers) {
      ::shutdown(p->conn->fd, SHUT_RDWR);
    }
    acceptor_.join();
    for (auto& c : conns) {
      c->reader.join();
    }
    for (auto& p : peers) {
      p->sender.join();
      p->conn->reader.join();
    }
    ::close(listen_fd_);
  }

  TransportCaps Caps() const override {
    TransportCaps c;
    c.host_memory = true;
    c.two_sided = true;
    c.notifications = true;
    c.cancel = true;
    return c;
  }

  absl::StatusOr<RegionHandle> Register(const MemoryRegion& region) override {
    return core_.AddRegion(region, /*allow_cuda=*/false);
  }

  absl::Status Deregister(RegionHandle region) override {
    return core_.RemoveRegion(region).status();
  }

  absl::StatusOr<PeerHandle> Connect(absl::string_view endpoint) override;
  absl::Status Disconnect(PeerHandle peer) override;

  absl::StatusOr<TransferId> PostTransfer(PeerHandle peer, uint64_t tag, RegionHandle src,
                                          absl::Span<const BlockPair> pairs,
                                          absl::string_view remote_descriptor,
                                          const TransferOptions& options) override;

  absl::Status Cancel(TransferId id) override {
    // The sender thread notices before its next frame and sends CANCEL; a cancelled
    // expectation rejects later frames (the sender learns through an ERROR frame).
    return core_.Cancel(id).status();
  }

 private:
  struct Peer {
    std::shared_ptr<Conn> conn;
    std::thread sender;
    // Guarded by the transport's mu_.
    std::deque<PreparedPost> queue;
    absl::flat_hash_set<uint64_t> in_flight;  // seq (= transfer id) awaiting ACK/ERROR
    bool cv_wake = false;
  };

  void AcceptLoop();
  void InboundLoop(std::shared_ptr<Conn> conn);
  void OutboundReaderLoop(std::shared_ptr<Peer> peer);
  void SenderLoop(std::shared_ptr<Peer> peer);
  absl::Status SendTransfer(Peer& peer, const PreparedPost& post);
  void PeerDied(Peer& peer, const absl::Status& why);
  absl::Status SendFrame(Conn& conn, FrameHeader h, absl::string_view body);
  bool HandleData(Conn& conn, const FrameHeader& h, absl::flat_hash_set<uint64_t>& failed);
  bool Drain(Conn& conn, uint64_t n);
  bool Running() const { return !stopping_.load(std::memory_order_relaxed); }

  const TcpTransportOptions options_;
  const int listen_fd_;
  std::atomic<bool> stopping_{false};
  std::thread acceptor_;

  absl::Mutex mu_;
  uint64_t next_conn_ ABSL_GUARDED_BY(mu_) = 1;
  transport_internal::PeerTable<std::shared_ptr<Peer>> peers_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, std::shared_ptr<Conn>> inbound_ ABSL_GUARDED_BY(mu_);
};

absl::Status TcpTransport::SendFrame(Conn& conn, FrameHeader h, absl::string_view body) {
  h.length = body.size();
  std::vector<iovec> iov = {{&h, sizeof(h)}};
  if (!body.empty()) {
    iov.push_back({const_cast<char*>(body.data()), body.size()});
  }
  absl::MutexLock lock(&conn.write_mu);
  return SendAll(conn.fd, std::move(iov), [] { return false; });
}

void TcpTransport::AcceptLoop() {
  while (Running()) {
    const int fd = transport_internal::AcceptTcp(listen_fd_, kPollSlice);
    if (fd < 0) {
      continue;
    }
    auto conn = std::make_shared<Conn>();
    conn->fd = fd;
    absl::MutexLock lock(&mu_);
    if (!Running()) {
      return;  // conn closes its fd
    }
    // Reap readers of closed connections (they only return after setting `finished`).
    for (auto it = inbound_.begin(); it != inbound_.end();) {
      if (it->second->finished.load()) {
        it->second->reader.join();
        inbound_.erase(it++);
      } else {
        ++it;
      }
    }
    conn->id = (uint64_t{1} << 63) | next_conn_++;
    inbound_[conn->id] = conn;
    conn->reader = std::thread([this, conn] { InboundLoop(conn); });
  }
}

bool TcpTransport::Drain(Conn& conn, uint64_t n) {
  if (n > kMaxDrainBytes) {
    return false;
  }
  std::vector<char> scratch(std::min<uint64_t>(n, kIoChunkBytes));
  while (n > 0) {
    const size_t k = std::min<uint64_t>(n, scratch.size());
    if (ReadFull(conn.fd, scratch.data(), k, [this] { return Running(); }) != SocketIo::kOk) {
      return false;
    }
    n -= k;
  }
  return true;
}

// Returns false when the connection must close.
bool TcpTransport::HandleData(Conn& conn, const FrameHeader& h,
                              absl::flat_hash_set<uint64_t>& failed) {
  if (failed.contains(h.seq)) {
    return Drain(conn, h.length);
  }
  absl::StatusOr<WriteGrant> grant =
      core_.BeginWrite(h.tag, h.nonce, h.dst_first, h.num_blocks, conn.id);
  if (grant.ok() && grant->length != h.length) {
    core_.EndWrite(*grant, false,
                   absl::DataLossError(
                       absl::StrCat("tcp frame length ", h.length, " does not match its blocks")));
    return false;  // a broken sender: the stream cannot be trusted any more
  }
  absl::Status error;
  if (grant.ok()) {
    uint64_t done = 0;
    while (done < h.length && grant->Valid()) {
      const uint64_t k = std::min<uint64_t>(h.length - done, kIoChunkBytes);
      if (ReadFull(conn.fd, grant->dst + done, k, [&] { return Running() && grant->Valid(); }) !=
          SocketIo::kOk) {
        if (!grant->Valid()) {
          break;  // cancelled or deregistered mid-frame: drain the rest below
        }
        core_.EndWrite(*grant, false, absl::UnavailableError("tcp sender connection closed"));
        return false;
      }
      done += k;
    }
    if (done == h.length) {
      core_.EndWrite(*grant, true);
      return true;
    }
    core_.EndWrite(*grant, false, absl::CancelledError("expectation ended during a write"));
    error = absl::CancelledError(absl::StrCat("receiver dropped transfer tag ", h.tag,
                                              " (cancelled, timed out or ",
                                              "deregistered) while data arrived"));
    if (!Drain(conn, h.length - done)) {
      return false;
    }
  } else {
    error = grant.status();
    if (!Drain(conn, h.length)) {
      return false;
    }
  }
  failed.insert(h.seq);
  FrameHeader e;
  e.type = kError;
  e.seq = h.seq;
  e.dst_first = static_cast<uint32_t>(error.code());
  return SendFrame(conn, e, error.message()).ok();
}

void TcpTransport::InboundLoop(std::shared_ptr<Conn> conn) {
  auto keep_going = [this] { return Running(); };
  // Hello: learn who is sending, answer with our instance id.
  FrameHeader h;
  bool ok = ReadFull(conn->fd, &h, sizeof(h), keep_going) == SocketIo::kOk &&
            h.magic == kFrameMagic && h.type == kHello && h.seq == kTransportProtocolVersion;
  if (ok) {
    conn->peer_instance = h.tag;
    FrameHeader reply;
    reply.type = kHello;
    reply.seq = kTransportProtocolVersion;
    reply.tag = core_.instance_id();
    ok = SendFrame(*conn, reply, "").ok();
  }
  absl::flat_hash_set<uint64_t> failed_seqs;  // drained silently after their ERROR
  while (ok && Running()) {
    if (ReadFull(conn->fd, &h, sizeof(h), keep_going) != SocketIo::kOk || h.magic != kFrameMagic) {
      break;
    }
    if (h.type == kData) {
      ok = HandleData(*conn, h, failed_seqs);
    } else if (h.type == kEnd) {
      if (failed_seqs.erase(h.seq) > 0) {
        continue;  // ERROR already sent
      }
      absl::Status s = core_.CompleteExpectation(h.tag, h.nonce);
      FrameHeader r;
      r.seq = h.seq;
      r.type = s.ok() ? kAck : kError;
      r.dst_first = static_cast<uint32_t>(s.code());
      ok = SendFrame(*conn, r, s.message()).ok();
    } else if (h.type == kCancel) {
      failed_seqs.erase(h.seq);
      core_.FailExpectation(h.tag, h.nonce,
                            absl::CancelledError(absl::StrCat("sender cancelled transfer tag ",
                                                              h.tag, " before completion")));
    } else {
      break;  // protocol error
    }
  }
  core_.FailExpectationsFromSource(
      conn->id,
      absl::UnavailableError(absl::StrCat("tcp connection from instance ", conn->peer_instance,
                                          " closed mid-transfer (peer died?)")));
  conn->dead.store(true);
  ::shutdown(conn->fd, SHUT_RDWR);
  conn->finished.store(true);  // the acceptor may join us now
}

absl::StatusOr<PeerHandle> TcpTransport::Connect(absl::string_view endpoint) {
  PD_ASSIGN_OR_RETURN(const EndpointInfo e,
                      transport_internal::DecodePeerEndpoint("tcp", endpoint));
  {
    absl::MutexLock lock(&mu_);
    std::optional<PeerHandle> live = peers_.FindIf([&](const std::shared_ptr<Peer>& p) {
      return p->conn->peer_instance == e.instance_id && !p->conn->dead.load();
    });
    if (live.has_value()) {
      return *live;
    }
  }
  PD_ASSIGN_OR_RETURN(const int fd,
                      transport_internal::DialTcp(e.address, options_.connect_timeout, "tcp"));
  auto conn = std::make_shared<Conn>();
  conn->fd = fd;  // closed with conn on every path below
  transport_internal::SetStreamSocketOptions(fd, kPollSlice);
  FrameHeader hello;
  hello.type = kHello;
  hello.seq = kTransportProtocolVersion;
  hello.tag = core_.instance_id();
  PD_RETURN_IF_ERROR(SendFrame(*conn, hello, ""));
  const absl::Time hello_deadline = absl::Now() + options_.connect_timeout;
  FrameHeader reply;
  if (ReadFull(fd, &reply, sizeof(reply), [&] { return absl::Now() < hello_deadline; }) !=
          SocketIo::kOk ||
      reply.magic != kFrameMagic || reply.type != kHello) {
    return absl::UnavailableError(absl::StrCat("tcp handshake with ", e.address, " failed"));
  }
  if (reply.seq != kTransportProtocolVersion) {
    return absl::FailedPreconditionError(absl::StrCat(
        "tcp protocol version mismatch: local=", kTransportProtocolVersion, " remote=", reply.seq));
  }
  if (reply.tag != e.instance_id) {
    return absl::FailedPreconditionError(
        absl::StrCat("endpoint names transport instance ", e.instance_id, " but ", e.address,
                     " is instance ", reply.tag, " (peer restarted? fetch its new endpoint)"));
  }
  conn->peer_instance = reply.tag;
  auto peer = std::make_shared<Peer>();
  peer->conn = conn;
  absl::MutexLock lock(&mu_);
  if (!Running()) {
    return absl::UnavailableError("tcp transport is shutting down");
  }
  conn->id = next_conn_++;
  const PeerHandle handle = peers_.Add(peer);
  peer->sender = std::thread([this, peer] { SenderLoop(peer); });
  conn->reader = std::thread([this, peer] { OutboundReaderLoop(peer); });
  VLOG(1) << "tcp transport connected to " << e.address << " instance " << e.instance_id;
  return handle;
}

absl::Status TcpTransport::Disconnect(PeerHandle handle) {
  std::shared_ptr<Peer> peer;
  {
    absl::MutexLock lock(&mu_);
    PD_ASSIGN_OR_RETURN(peer, peers_.Remove(handle));
  }
  PeerDied(*peer, absl::CancelledError(absl::StrCat("peer ", handle.value(), " disconnected")));
  ::shutdown(peer->conn->fd, SHUT_RDWR);
  peer->sender.join();
  peer->conn->reader.join();
  return absl::OkStatus();
}

absl::StatusOr<TransferId> TcpTransport::PostTransfer(PeerHandle handle, uint64_t tag,
                                                      RegionHandle src,
                                                      absl::Span<const BlockPair> pairs,
                                                      absl::string_view remote_descriptor,
                                                      const TransferOptions& options) {
  std::shared_ptr<Peer> peer;
  {
    absl::MutexLock lock(&mu_);
    PD_ASSIGN_OR_RETURN(peer, peers_.Get(handle, "post"));
  }
  if (peer->conn->dead.load()) {
    return transport_internal::ClosedPeerError(handle);
  }
  absl::StatusOr<PreparedPost> post =
      core_.PreparePost(peer->conn->peer_instance, tag, src, pairs, remote_descriptor, options);
  if (!post.ok()) {
    return post.status();
  }
  const TransferId id = post->id;
  absl::MutexLock lock(&mu_);
  if (peer->conn->dead.load()) {
    core_.Finish(id, absl::UnavailableError("tcp connection closed"));
  } else {
    peer->queue.push_back(*std::move(post));
  }
  return id;
}

void TcpTransport::PeerDied(Peer& peer, const absl::Status& why) {
  std::vector<uint64_t> ids;
  {
    absl::MutexLock lock(&mu_);
    peer.conn->dead.store(true);
    for (uint64_t seq : peer.in_flight) {
      ids.push_back(seq);
    }
    peer.in_flight.clear();
    for (const PreparedPost& p : peer.queue) {
      ids.push_back(p.id.value());
    }
    peer.queue.clear();
    peer.cv_wake = true;
  }
  for (uint64_t id : ids) {
    core_.Finish(TransferId(id), why);
  }
}

void TcpTransport::SenderLoop(std::shared_ptr<Peer> peer) {
  while (true) {
    PreparedPost post;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return peer->cv_wake || !peer->queue.empty() || !Running();
      };
      while (!ready()) {
        mu_.AwaitWithTimeout(absl::Condition(&ready), kPollSlice);
      }
      if (peer->queue.empty() || peer->conn->dead.load() || !Running()) {
        if (peer->conn->dead.load() || !Running()) {
          return;
        }
        peer->cv_wake = false;
        continue;
      }
      post = std::move(peer->queue.front());
      peer->queue.pop_front();
      peer->in_flight.insert(post.id.value());
    }
    absl::Status s = SendTransfer(*peer, post);
    if (!s.ok()) {
      LOG(WARNING) << "tcp transport: connection to instance " << peer->conn->peer_instance
                   << " failed: " << s;
      core_.Finish(post.id, s);
      PeerDied(*peer, absl::UnavailableError(absl::StrCat("tcp connection to instance ",
                                                          peer->conn->peer_instance,
                                                          " broke: ", s.message())));
      ::shutdown(peer->conn->fd, SHUT_RDWR);
      return;
    }
  }
}

absl::Status TcpTransport::SendTransfer(Peer& peer, const PreparedPost& post) {
  Conn& conn = *peer.conn;
  const uint32_t frame_blocks =
      static_cast<uint32_t>(std::max<uint64_t>(1, options_.max_frame_bytes / post.block_bytes));
  auto pending = [&] { return core_.IsPending(post.id) && Running(); };
  FrameHeader h;
  h.seq = post.id.value();
  h.tag = post.desc.tag;
  h.nonce = post.desc.region_nonce;
  for (const BlockRun& run : post.runs) {
    for (uint32_t off = 0; off < run.num_blocks; off += frame_blocks) {
      if (!pending()) {
        h.type = kCancel;
        return SendFrame(conn, h, "");
      }
      h.type = kData;
      h.dst_first = run.dst_first + off;
      h.num_blocks = std::min(frame_blocks, run.num_blocks - off);
      h.length = uint64_t{h.num_blocks} * post.block_bytes;
      const char* src = post.src_base + uint64_t{run.src_first + off} * post.block_bytes;
      std::vector<iovec> iov = {{&h, sizeof(h)}, {const_cast<char*>(src), h.length}};
      absl::MutexLock lock(&conn.write_mu);
      PD_RETURN_IF_ERROR(SendAll(conn.fd, std::move(iov), pending));
    }
  }
  h.type = kEnd;
  h.dst_first = 0;
  h.num_blocks = 0;
  return SendFrame(conn, h, "");
}

void TcpTransport::OutboundReaderLoop(std::shared_ptr<Peer> peer) {
  Conn& conn = *peer->conn;
  FrameHeader h;
  while (Running() && !conn.dead.load()) {
    const SocketIo r =
        ReadFull(conn.fd, &h, sizeof(h), [&] { return Running() && !conn.dead.load(); });
    if (r != SocketIo::kOk || h.magic != kFrameMagic || (h.type != kAck && h.type != kError)) {
      break;
    }
    std::string msg;
    if (h.length > 0) {
      if (h.length > 4096) {
        break;
      }
      msg.resize(h.length);
      if (ReadFull(conn.fd, msg.data(), msg.size(), [this] { return Running(); }) !=
          SocketIo::kOk) {
        break;
      }
    }
    {
      absl::MutexLock lock(&mu_);
      peer->in_flight.erase(h.seq);
    }
    if (h.type == kAck) {
      core_.Finish(TransferId(h.seq), absl::OkStatus());
    } else {
      const auto code = static_cast<absl::StatusCode>(h.dst_first);
      core_.Finish(TransferId(h.seq),
                   absl::Status(code == absl::StatusCode::kOk ? absl::StatusCode::kUnknown : code,
                                absl::StrCat("receiver: ", msg)));
    }
  }
  PeerDied(*peer, absl::UnavailableError(
                      absl::StrCat("tcp connection to instance ", conn.peer_instance,
                                   " closed before the transfer was acknowledged (peer died?)")));
  ::shutdown(conn.fd, SHUT_RDWR);
}

}  // namespace

absl::StatusOr<std::unique_ptr<KvTransport>> CreateTcpTransport(
    const TcpTransportOptions& options) {
  if (options.max_frame_bytes == 0) {
    return absl::InvalidArgumentError("tcp transport: max_frame_bytes must be positive");
  }
  PD_ASSIGN_OR_RETURN(
      transport_internal::ListeningSocket listener,
      transport_internal::ListenTcp(options.listen_host, options.listen_port, "tcp"));
  return std::unique_ptr<KvTransport>(
      new TcpTransport(options, listener.fd, std::move(listener.address)));
}

}  // namespace pd::transport
