// A CPU fake of the parts of the CUDA runtime and NCCL that NcclTransport and TestDeviceBuffer
// call, so the NCCL backend's host logic (handshake, frame order, progress, abort paths) runs in
// unit tests on machines without a GPU. Test-only: linked instead of libcudart and libnccl into
// transport_nccl_fake_test, never into a product binary.
//
// Model: kFakeDeviceCount devices; "device memory" is host memory remembered with its device
// (cudaPointerGetAttributes answers from that table). Streams run NCCL operations only: a send
// of rank r to peer p matches p's next receive from r, in issue order, exactly as NCCL matches
// point-to-point operations; a matched pair is copied by a worker thread a little later, so
// events really are pending for a while. Communicators are created non-blocking (init returns
// ncclInProgress until both ranks joined) and, like NCCL, reject two ranks on the same device.
// ncclCommAbort ends its own pending operations without copying; the peer's stay pending until
// it aborts too (a real dead peer behaves the same). The collectives engine/parallel's
// NcclCollective uses (ncclAllReduce of floats with ncclSum, ncclAllGather of floats) complete
// once both ranks issued them, the sum taken in rank order; cudaMemcpy2DAsync waits for its
// stream's earlier operations, then copies.
//
// Thread-safe.
#pragma once

#include <cstddef>

namespace pd::transport::fake_cuda {

inline constexpr int kFakeDeviceCount = 2;

// While paused, matched operations are not copied (they stay pending): lets tests hold a
// group in flight. Resuming copies what is queued.
void PauseCopies(bool paused);

// Number of communicators aborted so far (tests check that an abort happened).
int AbortCount();

// Issued send/recv operations not completed yet (over all communicators).
int PendingOps();
// Blocks until PendingOps() >= n or `timeout_ms` passed; returns whether it got there.
bool WaitForPendingOps(int n, int timeout_ms);

// Bytes copied by matched send/recv pairs so far.
size_t CopiedBytes();

}  // namespace pd::transport::fake_cuda
