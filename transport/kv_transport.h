// KvTransport: moves KV-cache blocks from one worker's block pool to another's (prefill ->
// decode); docs/development.md, "Backend interfaces".
//
// Model. Each side registers its pool — one region of `num_blocks` equal blocks of
// `block_bytes` (MemoryRegion::geometry) — and publishes LocalEndpoint() bytes. A transfer is
// announced by the receiver: ExpectTransfer(tag, dst region, dst blocks) returns an Expectation
// whose `descriptor` (opaque bytes) travels to the sender in the control-plane RPC and whose
// `id` the receiver polls to learn that the blocks arrived. The sender then calls
// PostTransfer(peer, tag, src region, (src block, dst block) pairs, descriptor); its pairs must
// name every announced dst block exactly once. Runs of consecutive (src, dst) pairs are
// coalesced into one operation. Both ids reach kDone only when every byte is in place at the
// receiver (one-sided backends send a completion notification after a flush), so the decode
// worker may use the blocks as soon as its Expectation is done.
//
// Safety. The descriptor carries the receiver's instance id, the registration's nonce (fresh on
// every Register) and the pool geometry. A descriptor for another peer, another pool, a
// deregistered or re-registered region, or an incompatible geometry is rejected with
// FailedPrecondition; receivers validate every incoming extent against the announcement and
// never write outside announced blocks.
//
// Errors (canonical codes): InvalidArgument for malformed input (block out of range, pairs not
// matching the announcement, garbage descriptor); FailedPrecondition for handshake/geometry
// mismatch and stale descriptors; NotFound for unknown handles/ids; Unavailable when the peer
// died or the connection broke; DeadlineExceeded when a transfer outlived its timeout;
// Cancelled after Cancel; Unimplemented for optional operations a backend lacks (check Caps()).
//
// Thread-safety: every method of every backend is thread-safe. Memory passed to Register must
// stay valid until Deregister returns; the transport never frees it.
#pragma once

#include <cstdint>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/base/strong_id.h"
#include "transport/handshake.h"

namespace pd::transport {

enum class MemoryKind : uint8_t { kHost = 0, kCuda = 1 };

// One registered pool. `base` is host memory or (kCuda) device memory on `device`.
struct MemoryRegion {
  void* base = nullptr;
  uint64_t size_bytes = 0;  // >= geometry.num_blocks * geometry.block_bytes
  MemoryKind kind = MemoryKind::kHost;
  int device = 0;  // CUDA device ordinal for kCuda
  PoolGeometry geometry;
};

using RegionHandle = StrongId<struct RegionHandleTag, uint64_t>;
using PeerHandle = PeerId;

struct BlockPair {
  BlockId src;  // block in the sender's registered region
  BlockId dst;  // block in the receiver's region, announced in its descriptor
};

// What a backend can do; callers check it before using optional operations.
struct TransportCaps {
  bool host_memory = false;    // MemoryKind::kHost regions
  bool cuda_memory = false;    // MemoryKind::kCuda regions
  bool one_sided = false;      // data written by RMA without receiver CPU copies
  bool two_sided = false;      // data sent as messages the receiver places
  bool notifications = false;  // the receiver's Expectation completes (true for all backends)
  bool cancel = false;         // Cancel is implemented
  // AllocateHost gives pool memory this backend moves faster than memory from elsewhere (UCX:
  // shared segments a peer on the host writes with one memcpy); pools should come from it.
  bool fast_host_allocation = false;
};

enum class TransferPhase : uint8_t { kPending, kDone, kFailed };

struct TransferState {
  TransferPhase phase = TransferPhase::kPending;
  absl::Status status;  // non-OK exactly when phase == kFailed
  uint64_t bytes = 0;   // payload bytes of the transfer (all of them once kDone)

  bool finished() const { return phase != TransferPhase::kPending; }
};

// Host memory a transport allocated for a pool (KvTransport::AllocateHost). The bytes stay at
// data() until the object is destroyed, which must happen after every region inside it was
// deregistered; it may outlive the transport that made it. Zero-filled when returned.
// Thread-compatible.
class HostAllocation {
 public:
  virtual ~HostAllocation() = default;
  virtual void* data() const = 0;
  virtual uint64_t size() const = 0;
  // How the memory was obtained, for logs (e.g. "mmap", "ucx sysv segment").
  virtual std::string Describe() const = 0;
};

struct TransferOptions {
  // The transfer fails with DeadlineExceeded if not done this long after it was posted or
  // announced. Must be positive.
  absl::Duration timeout = absl::Seconds(30);
};

// ExpectTransfer's result: `descriptor` goes to the sender; `id` tracks arrival locally.
struct Expectation {
  TransferId id;
  std::string descriptor;
};

class KvTransport {
 public:
  virtual ~KvTransport() = default;

  // Backend name as used by the registry: "loopback", "tcp", "ucx", "nccl".
  virtual absl::string_view Name() const = 0;
  virtual TransportCaps Caps() const = 0;

  // Registers a pool. InvalidArgument for a null base, a bad geometry or size_bytes too small;
  // Unimplemented for a memory kind the backend lacks.
  virtual absl::StatusOr<RegionHandle> Register(const MemoryRegion& region) = 0;
  // Unregisters; pending expectations on it fail with FailedPrecondition, and descriptors made
  // for it are rejected from then on. Returns after any in-progress write into it has stopped.
  // NotFound for an unknown handle.
  virtual absl::Status Deregister(RegionHandle region) = 0;

  // Allocates `bytes` (> 0) of host memory for a pool this transport will move data into or
  // out of, placed where the backend reaches it fastest: UCX maps it through ucp_mem_map, so
  // a peer on the same host writes into it with one memcpy (a shared-memory segment) instead of
  // a kernel-assisted copy. Register it like any other memory. The default is a page-aligned
  // anonymous mapping. InvalidArgument for 0, ResourceExhausted when no memory is left.
  virtual absl::StatusOr<std::unique_ptr<HostAllocation>> AllocateHost(uint64_t bytes);

  // Bytes a peer passes to Connect (out of band, e.g. in worker registration).
  virtual std::string LocalEndpoint() const = 0;
  // Connects to (or reuses a connection to) the transport that published `endpoint`.
  // InvalidArgument for garbage, FailedPrecondition for another backend or protocol version,
  // Unavailable when unreachable.
  virtual absl::StatusOr<PeerHandle> Connect(absl::string_view endpoint) = 0;
  // Drops a connection; its pending transfers fail with Cancelled. Optional.
  virtual absl::Status Disconnect(PeerHandle peer);

  // Receiver: announces that `dst_blocks` (distinct, in range) of `dst` will be written by a
  // transfer tagged `tag` (unique among this transport's pending expectations; AlreadyExists
  // otherwise).
  virtual absl::StatusOr<Expectation> ExpectTransfer(uint64_t tag, RegionHandle dst,
                                                     absl::Span<const BlockId> dst_blocks,
                                                     const TransferOptions& options = {}) = 0;

  // Sender: writes src blocks to the announced dst blocks of `remote_descriptor`. Returns once
  // the transfer is queued; progress is reported by Poll/Wait.
  virtual absl::StatusOr<TransferId> PostTransfer(PeerHandle peer, uint64_t tag, RegionHandle src,
                                                  absl::Span<const BlockPair> pairs,
                                                  absl::string_view remote_descriptor,
                                                  const TransferOptions& options = {}) = 0;

  // State of a posted transfer or of an expectation. NotFound for an unknown (or long
  // forgotten: the last few thousand finished ids are kept) id.
  virtual absl::StatusOr<TransferState> Poll(TransferId id) = 0;
  // Blocks until the transfer finished or `timeout` passed (then returns the pending state).
  virtual absl::StatusOr<TransferState> Wait(TransferId id, absl::Duration timeout) = 0;
  // Fails a pending transfer or expectation with Cancelled; the peer is told. No effect on a
  // finished one. On the receiver, returns after any in-progress write into its blocks
  // stopped. Optional (Caps().cancel).
  virtual absl::Status Cancel(TransferId id);
};

// A run of `num_blocks` consecutive src blocks going to consecutive dst blocks.
struct BlockRun {
  uint32_t src_first = 0;
  uint32_t dst_first = 0;
  uint32_t num_blocks = 0;
};

// Sorts by dst and merges pairs whose src and dst both continue the previous run.
std::vector<BlockRun> CoalescePairs(absl::Span<const BlockPair> pairs);

absl::string_view TransferPhaseName(TransferPhase phase);
inline std::ostream& operator<<(std::ostream& os, TransferPhase p) {
  return os << TransferPhaseName(p);
}

}  // namespace pd::transport
