// Internals of the NCCL backend shared by its sources: the transport class, its per-connection
// state and the CUDA/NCCL helpers. Private to transport/nccl (it includes cuda_runtime.h and
// nccl.h: nothing outside this folder may include it). The design is in nccl_transport.h, the
// control protocol and its ordering invariant in nccl_protocol.h. The class is split by job:
//
//   nccl_transport.cc      the transport object: lifecycle, registration, Cancel, the factory
//   nccl_control_plane.cc  the socket control plane: accepting and dialing, the HELLO/UNIQUE_ID
//                          handshakes, the frame loops of both sides (TRANSFER, GO, REJECT,
//                          DONE), Connect, Disconnect and PostTransfer
//   nccl_data_plane.cc     the NCCL data plane: communicators, send/recv groups on the
//                          connection's stream, the progress thread that retires them, aborts
//
// Thread-safety as documented per member; NcclTransport itself is thread-safe.
#pragma once

#include <cuda_runtime.h>
#include <nccl.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "transport/internal/peer_table.h"
#include "transport/internal/transport_core.h"
#include "transport/kv_transport.h"
#include "transport/nccl/nccl_protocol.h"
#include "transport/nccl/nccl_transport.h"

namespace pd::transport::nccl_internal {

// "<what>: <NCCL's error string> (<code>)".
std::string NcclError(absl::string_view what, ncclResult_t r);
// "<what>: <CUDA's error string>".
std::string CudaError(absl::string_view what, cudaError_t e);

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
absl::Status WaitComm(ncclComm_t comm, absl::Time deadline, absl::string_view what);

// One NCCL group in flight: a sender's sends or a receiver's recvs of one transfer.
struct Op {
  uint64_t seq = 0;  // the sender's transfer id
  cudaEvent_t event = nullptr;
  uint64_t src_region = 0;  // sender: the pinned source region
  uint64_t tag = 0;         // receiver
  uint64_t nonce = 0;       // receiver
  std::vector<transport_internal::WriteGrant> grants;
};

// A transfer the sender announced and the receiver has not answered yet.
struct AwaitingGo {
  transport_internal::PreparedPost post;
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

// The NCCL KvTransport (nccl_transport.h). Threads: the acceptor (AcceptLoop), one reader per
// connection (InboundLoop or OutboundLoop), the progress thread (ProgressLoop) and the API
// callers. Thread-safe: mu_ guards the tables below, each Conn guards its own state.
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

}  // namespace pd::transport::nccl_internal
