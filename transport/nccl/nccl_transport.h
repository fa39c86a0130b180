// NcclTransport: KV blocks between GPU pools with NCCL point-to-point send/recv (built when
// PD_ENABLE_NCCL is on). nccl.h and cuda_runtime.h appear only in this folder's .cc files.
// Private to transport/: use the registry.
//
// Design (protocol and ordering invariant in nccl_protocol.h, operator notes in
// docs/transport.md "NCCL backend"):
//  - Control plane: one TCP connection per connected pair (listen_host:listen_port). Connect
//    does the HELLO handshake (protocol version, instance ids), sends an ncclUniqueId, and both
//    sides create a 2-rank non-blocking communicator (connector rank 0 = sender, acceptor
//    rank 1 = receiver) and one CUDA stream for it. Communicator creation polls
//    ncclCommGetAsyncError until connect_timeout, then aborts: a dead peer cannot hang Connect.
//  - Data: PostTransfer validates through TransportCore and sends a TRANSFER frame. The
//    receiver validates every run against the announcement, issues one ncclRecv group on the
//    connection's stream and answers GO; the sender then issues the matching ncclSend group.
//    A progress thread polls the groups' CUDA events (sleeping when idle), completes the
//    receiver's expectation and answers DONE, which completes the sender's transfer: both ids
//    are done only when every byte is in the receiver's blocks.
//  - Failures: a closed control connection or an NCCL async error aborts the communicator
//    (ncclCommAbort) and fails every transfer on it with Unavailable; Connect again builds a
//    fresh one. NCCL cannot cancel one operation, so an issued group that outlives its transfer
//    (timeout, receiver Cancel or Deregister) aborts its connection too.
//  - Cancel: receiver expectations only (Caps().cancel is false): Cancel of a pending posted
//    transfer is Unimplemented (it ends at its timeout); of a finished one, a no-op.
//  - Memory: MemoryKind::kCuda on `device` only; one device per transport. NCCL does not
//    support two ranks of one communicator on one GPU, so the two ends use different devices.
//  - Deregister of a source pool waits until no issued send reads from it.
//
// Thread-safe.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "transport/kv_transport.h"

namespace pd::transport {

struct NcclTransportOptions {
  std::string listen_host = "127.0.0.1";  // numeric IPv4 address of the control listener
  int listen_port = 0;                    // 0: any free port
  // Bounds the handshake, communicator creation and each NCCL group enqueue.
  absl::Duration connect_timeout = absl::Seconds(5);
  int device = 0;  // CUDA device ordinal of every registered pool and of the communicators
};

// FailedPrecondition when no CUDA device is usable; InvalidArgument for a device ordinal
// outside [0, device count) or a bad listen address; Unavailable when the address cannot be
// bound.
absl::StatusOr<std::unique_ptr<KvTransport>> CreateNcclTransport(
    const NcclTransportOptions& options);

// Number of usable CUDA devices (0 without a driver or device).
int NcclUsableDeviceCount();

}  // namespace pd::transport
