// The NCCL backend's control protocol: the frames its TCP control connection carries and the
// receiver-side validation of an announced batch. Pure host code (no CUDA, no NCCL), so it is
// built and unit-tested on machines without a GPU. Private to transport/nccl.
//
// Wire: every frame is a 16-byte header {magic, type, body_bytes, reserved} followed by
// `body_bytes` of little-endian fields (transport/byte_codec.h). One connection per
// (connector, acceptor) pair; the connector is NCCL rank 0 and the only sender of data, the
// acceptor is rank 1 and only receives.
//
//   connector                                  acceptor
//   HELLO {version, instance, expected peer} ->
//                                           <- HELLO {version, instance}
//   UNIQUE_ID {ncclUniqueId bytes}          ->
//   ncclCommInitRankConfig(rank 0)             ncclCommInitRankConfig(rank 1)
//                                           <- READY {status}
//   TRANSFER {seq, tag, nonce, block_bytes, dst runs} ->
//                                              validate every run (TransportCore::BeginWrite)
//                                           <- REJECT {seq, status}        (nothing issued), or
//                                              ncclRecv group on the stream
//                                           <- GO {seq}
//   ncclSend group on the stream
//                                              recv event complete
//                                           <- DONE {seq, status}
//
// Ordering invariant: NCCL matches point-to-point operations between two ranks in the order
// they are issued, so both sides must issue the same groups in the same order. The acceptor
// issues a recv group only for a TRANSFER it accepted, and sends GO right after issuing it,
// from the one thread that reads the connection; the connector issues a send group only on
// GO, from the one thread that reads GO frames. TCP keeps frames in order, so the two
// sequences of groups are identical. A REJECTed transfer issues nothing on either side, so a
// stale or cancelled announcement can never leave an unmatched send on the communicator.
//
// Thread-compatible value types and free functions.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "transport/internal/transport_core.h"
#include "transport/kv_transport.h"

namespace pd::transport::nccl_internal {

inline constexpr uint32_t kFrameMagic = 0x4C43434E;  // "NCCL" little-endian
inline constexpr uint32_t kFrameHeaderBytes = 16;
inline constexpr uint32_t kMaxFrameBodyBytes = 64u << 20;
inline constexpr uint32_t kUniqueIdBytes = 128;  // NCCL_UNIQUE_ID_BYTES
inline constexpr uint32_t kMaxStatusMessageBytes = 4096;

enum class FrameType : uint32_t {
  kHello = 1,
  kUniqueId = 2,
  kReady = 3,
  kTransfer = 4,
  kGo = 5,
  kReject = 6,
  kDone = 7,
};
absl::string_view FrameTypeName(FrameType type);

struct FrameHeader {
  FrameType type = FrameType::kHello;
  uint32_t body_bytes = 0;
};

struct HelloFrame {
  uint32_t protocol_version = kTransportProtocolVersion;
  uint64_t instance_id = 0;
  uint64_t expected_instance_id = 0;  // connector: the instance its endpoint named; acceptor: 0
};

// One accepted batch: `runs` are destination runs (src_first is not sent).
struct TransferFrame {
  uint64_t seq = 0;  // the sender's transfer id
  uint64_t tag = 0;
  uint64_t nonce = 0;  // the receiver's region nonce from the descriptor
  uint64_t block_bytes = 0;
  std::vector<BlockRun> runs;

  uint64_t TotalBytes() const;
};

// GO (status OK), REJECT and DONE (status OK: every block arrived), READY (seq 0).
struct StatusFrame {
  uint64_t seq = 0;
  absl::Status status;
};

// Header + body. CHECK-fails for a body above kMaxFrameBodyBytes (callers bound their input).
std::string EncodeFrame(FrameType type, absl::string_view body);
// InvalidArgument for a wrong magic, an unknown type or a body above kMaxFrameBodyBytes.
absl::StatusOr<FrameHeader> DecodeFrameHeader(absl::string_view bytes);

std::string EncodeHello(const HelloFrame& f);
absl::StatusOr<HelloFrame> DecodeHello(absl::string_view body);
std::string EncodeTransfer(const TransferFrame& f);
// InvalidArgument for truncation, trailing bytes, zero block_bytes, an empty run list or an
// empty run, or a byte count that overflows 64 bits.
absl::StatusOr<TransferFrame> DecodeTransfer(absl::string_view body);
std::string EncodeStatus(const StatusFrame& f);
// The message is truncated to kMaxStatusMessageBytes on encode; a code outside absl's range
// decodes as kUnknown.
absl::StatusOr<StatusFrame> DecodeStatus(absl::string_view body);

// Builds the TRANSFER frame of a validated post (runs coalesced by TransportCore).
TransferFrame MakeTransferFrame(const transport_internal::PreparedPost& post);

// Receiver: validates every run of `frame` against the pending expectation for its tag
// (nonce, announced and not yet written blocks, block size) and marks them in progress. All or
// nothing: when run k fails, runs 0..k-1 end with EndWrite(ok=false), which fails the
// expectation (a sender that announces a bad run cannot be trusted with the rest), and the
// returned error is the first failure. A failure on the very first run (stale nonce, cancelled
// or unknown tag) leaves the expectation as it was. `source` is the connection id.
absl::StatusOr<std::vector<transport_internal::WriteGrant>> AcquireGrants(
    transport_internal::TransportCore& core, const TransferFrame& frame, uint64_t source);

// Blocking socket I/O for the control connection. `fd` is a connected stream socket with
// SO_RCVTIMEO/SO_SNDTIMEO set to a short slice; `keep_going` is re-checked on each timeout.
// Unavailable when the peer closed or the socket failed, DeadlineExceeded when `deadline`
// passed, Cancelled when `keep_going` turned false.
struct Frame {
  FrameType type = FrameType::kHello;
  std::string body;
};
absl::Status WriteFrame(int fd, FrameType type, absl::string_view body, absl::Time deadline);
absl::StatusOr<Frame> ReadFrame(int fd, absl::Time deadline,
                                const std::function<bool()>& keep_going);

}  // namespace pd::transport::nccl_internal
