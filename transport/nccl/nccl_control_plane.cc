// NcclTransport's socket control plane: one TCP connection per connected pair carries the
// frames of nccl_protocol.h. The acceptor side (rank 1, receiver) answers HELLO, joins the
// communicator, and for each TRANSFER validates the runs, issues the receive group and answers
// GO or REJECT; the connector side (rank 0, sender) dials, runs the handshake, announces posts
// and issues each send group on GO. The NCCL calls themselves (communicators, groups, aborts)
// are in nccl_data_plane.cc.
#include <cuda_runtime.h>
#include <nccl.h>
#include <sys/socket.h>

#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/base/status_macros.h"
#include "common/log/log.h"
#include "transport/internal/peer_table.h"
#include "transport/internal/socket_util.h"
#include "transport/internal/transport_core.h"
#include "transport/nccl/nccl_protocol.h"
#include "transport/nccl/nccl_transport_impl.h"

namespace pd::transport::nccl_internal {
namespace {

using transport_internal::PreparedPost;
using transport_internal::WriteGrant;

// Control sockets wake their threads this often to re-check whether to keep going.
constexpr absl::Duration kSocketSlice = absl::Milliseconds(50);

}  // namespace

absl::Status NcclTransport::SendFrame(Conn& conn, FrameType type, absl::string_view body) {
  absl::MutexLock lock(&conn.write_mu);
  return WriteFrame(conn.fd, type, body, absl::Now() + options_.connect_timeout);
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
  absl::StatusOr<HelloFrame> hello = f->type == FrameType::kHello
                                         ? DecodeHello(f->body)
                                         : absl::InvalidArgumentError("expected a hello frame");
  if (!hello.ok()) {
    return hello.status();
  }
  conn.peer_instance = hello->instance_id;
  HelloFrame reply;
  reply.instance_id = core_.instance_id();
  absl::Status s = SendFrame(conn, FrameType::kHello, EncodeHello(reply));
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
  absl::Status sent = SendFrame(conn, FrameType::kReady, EncodeStatus(StatusFrame{0, s}));
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
      s = absl::InvalidArgumentError(
          absl::StrCat("nccl receiver: unexpected ", FrameTypeName(f->type), " frame"));
      break;
    }
    absl::StatusOr<TransferFrame> t = DecodeTransfer(f->body);
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
  absl::StatusOr<std::vector<WriteGrant>> grants = AcquireGrants(core_, frame, conn.id);
  if (!grants.ok()) {
    VLOG(2) << "nccl receiver: rejects transfer tag " << frame.tag << ": " << grants.status();
    return SendFrame(conn, FrameType::kReject,
                     EncodeStatus(StatusFrame{frame.seq, grants.status()}))
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
                             EncodeStatus(StatusFrame{frame.seq, absl::OkStatus()}));
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
  HelloFrame hello;
  hello.instance_id = core_.instance_id();
  hello.expected_instance_id = e.instance_id;
  absl::Status s = SendFrame(conn, FrameType::kHello, EncodeHello(hello));
  absl::StatusOr<Frame> f = s.ok() ? ReadFrame(conn.fd, deadline, nullptr) : s;
  absl::StatusOr<HelloFrame> reply = !f.ok() ? f.status()
                                     : f->type == FrameType::kHello
                                         ? DecodeHello(f->body)
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
                                            ? DecodeStatus(f->body)
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
  const std::string body = EncodeTransfer(MakeTransferFrame(*post));
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
    absl::StatusOr<StatusFrame> st = DecodeStatus(f->body);
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
      s = absl::InvalidArgumentError(
          absl::StrCat("nccl sender: unexpected ", FrameTypeName(f->type), " frame"));
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

}  // namespace pd::transport::nccl_internal
