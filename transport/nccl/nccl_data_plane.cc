// NcclTransport's NCCL data plane: the 2-rank non-blocking communicator of each connection
// and its stream, the send/recv groups issued on it (one per transfer, in the same order on
// both sides: nccl_protocol.h), the progress thread that polls their CUDA events and retires
// them (completing expectations, answering DONE, releasing pins), and the abort that ends a
// connection's in-flight groups when anything goes wrong. The frames that drive it are in
// nccl_control_plane.cc.
#include <cuda_runtime.h>
#include <nccl.h>
#include <sys/socket.h>

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/base/status_macros.h"
#include "common/log/log.h"
#include "transport/internal/transport_core.h"
#include "transport/nccl/nccl_protocol.h"
#include "transport/nccl/nccl_transport_impl.h"

namespace pd::transport::nccl_internal {
namespace {

using transport_internal::WriteGrant;

// The progress thread polls CUDA events this often while any group is in flight, and waits
// for work (or this long, to notice async errors and reap closed connections) otherwise.
constexpr absl::Duration kBusyPoll = absl::Microseconds(100);
constexpr absl::Duration kIdlePoll = absl::Milliseconds(50);
constexpr absl::Duration kNcclPoll = absl::Microseconds(200);

}  // namespace

std::string NcclError(absl::string_view what, ncclResult_t r) {
  return absl::StrCat(what, ": ", ncclGetErrorString(r), " (", static_cast<int>(r), ")");
}

std::string CudaError(absl::string_view what, cudaError_t e) {
  return absl::StrCat(what, ": ", cudaGetErrorString(e));
}

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
    if (!SendFrame(conn, FrameType::kDone, EncodeStatus(StatusFrame{op.seq, s})).ok()) {
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

}  // namespace pd::transport::nccl_internal
