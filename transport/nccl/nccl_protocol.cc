#include "transport/nccl/nccl_protocol.h"

#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"
#include "common/log/log.h"
#include "transport/byte_codec.h"
#include "transport/internal/socket_io.h"

namespace pd::transport::nccl_internal {

using transport_internal::PreparedPost;
using transport_internal::SocketIo;
using transport_internal::TransportCore;
using transport_internal::WriteGrant;

absl::string_view FrameTypeName(FrameType type) {
  switch (type) {
    case FrameType::kHello:
      return "hello";
    case FrameType::kUniqueId:
      return "unique_id";
    case FrameType::kReady:
      return "ready";
    case FrameType::kTransfer:
      return "transfer";
    case FrameType::kGo:
      return "go";
    case FrameType::kReject:
      return "reject";
    case FrameType::kDone:
      return "done";
  }
  return "unknown";
}

uint64_t TransferFrame::TotalBytes() const {
  uint64_t blocks = 0;
  for (const BlockRun& r : runs) {
    blocks += r.num_blocks;
  }
  return blocks * block_bytes;
}

std::string EncodeFrame(FrameType type, absl::string_view body) {
  CHECK_LE(body.size(), kMaxFrameBodyBytes) << "nccl control frame body too large";
  ByteWriter w;
  w.U32(kFrameMagic);
  w.U32(static_cast<uint32_t>(type));
  w.U32(static_cast<uint32_t>(body.size()));
  w.U32(0);
  std::string out = w.Take();
  out.append(body.data(), body.size());
  return out;
}

absl::StatusOr<FrameHeader> DecodeFrameHeader(absl::string_view bytes) {
  ByteReader r(bytes);
  const uint32_t magic = r.U32();
  const uint32_t type = r.U32();
  const uint32_t body = r.U32();
  r.U32();
  if (!r.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("nccl frame header truncated at ", bytes.size(), " bytes"));
  }
  if (magic != kFrameMagic) {
    return absl::InvalidArgumentError(absl::StrCat("nccl frame: bad magic 0x", absl::Hex(magic)));
  }
  if (type < static_cast<uint32_t>(FrameType::kHello) ||
      type > static_cast<uint32_t>(FrameType::kDone)) {
    return absl::InvalidArgumentError(absl::StrCat("nccl frame: unknown type ", type));
  }
  if (body > kMaxFrameBodyBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("nccl frame: body of ", body, " bytes exceeds ", kMaxFrameBodyBytes));
  }
  return FrameHeader{static_cast<FrameType>(type), body};
}

std::string EncodeHello(const HelloFrame& f) {
  ByteWriter w;
  w.U32(f.protocol_version);
  w.U64(f.instance_id);
  w.U64(f.expected_instance_id);
  return w.Take();
}

absl::StatusOr<HelloFrame> DecodeHello(absl::string_view body) {
  ByteReader r(body);
  HelloFrame f;
  f.protocol_version = r.U32();
  f.instance_id = r.U64();
  f.expected_instance_id = r.U64();
  if (!r.done()) {
    return absl::InvalidArgumentError(
        absl::StrCat("nccl hello frame: malformed body of ", body.size(), " bytes"));
  }
  return f;
}

std::string EncodeTransfer(const TransferFrame& f) {
  ByteWriter w;
  w.U64(f.seq);
  w.U64(f.tag);
  w.U64(f.nonce);
  w.U64(f.block_bytes);
  w.U32(static_cast<uint32_t>(f.runs.size()));
  for (const BlockRun& run : f.runs) {
    w.U32(run.dst_first);
    w.U32(run.num_blocks);
  }
  return w.Take();
}

absl::StatusOr<TransferFrame> DecodeTransfer(absl::string_view body) {
  ByteReader r(body);
  TransferFrame f;
  f.seq = r.U64();
  f.tag = r.U64();
  f.nonce = r.U64();
  f.block_bytes = r.U64();
  const uint32_t n = r.U32();
  if (!r.ok() || uint64_t{n} * 8 != r.remaining()) {
    return absl::InvalidArgumentError(
        absl::StrCat("nccl transfer frame: malformed body of ", body.size(), " bytes"));
  }
  if (f.block_bytes == 0 || n == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "nccl transfer frame seq ", f.seq, ": block_bytes ", f.block_bytes, ", ", n, " runs"));
  }
  f.runs.reserve(n);
  uint64_t blocks = 0;
  for (uint32_t i = 0; i < n; ++i) {
    BlockRun run;
    run.dst_first = r.U32();
    run.num_blocks = r.U32();
    if (run.num_blocks == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("nccl transfer frame seq ", f.seq, ": run ", i, " is empty"));
    }
    blocks += run.num_blocks;
    f.runs.push_back(run);
  }
  if (blocks > std::numeric_limits<uint64_t>::max() / f.block_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("nccl transfer frame seq ", f.seq, ": byte count overflows"));
  }
  return f;
}

std::string EncodeStatus(const StatusFrame& f) {
  ByteWriter w;
  w.U64(f.seq);
  w.U32(static_cast<uint32_t>(f.status.code()));
  w.Bytes(f.status.message().substr(0, kMaxStatusMessageBytes));
  return w.Take();
}

absl::StatusOr<StatusFrame> DecodeStatus(absl::string_view body) {
  ByteReader r(body);
  StatusFrame f;
  f.seq = r.U64();
  uint32_t code = r.U32();
  std::string message = r.Bytes(kMaxStatusMessageBytes);
  if (!r.done()) {
    return absl::InvalidArgumentError(
        absl::StrCat("nccl status frame: malformed body of ", body.size(), " bytes"));
  }
  if (code > static_cast<uint32_t>(absl::StatusCode::kUnauthenticated)) {
    code = static_cast<uint32_t>(absl::StatusCode::kUnknown);
  }
  f.status = absl::Status(static_cast<absl::StatusCode>(code), message);
  return f;
}

TransferFrame MakeTransferFrame(const PreparedPost& post) {
  TransferFrame f;
  f.seq = post.id.value();
  f.tag = post.desc.tag;
  f.nonce = post.desc.region_nonce;
  f.block_bytes = post.block_bytes;
  f.runs = post.runs;
  for (BlockRun& r : f.runs) {
    r.src_first = 0;  // not on the wire
  }
  return f;
}

absl::StatusOr<std::vector<WriteGrant>> AcquireGrants(TransportCore& core,
                                                      const TransferFrame& frame, uint64_t source) {
  std::vector<WriteGrant> grants;
  grants.reserve(frame.runs.size());
  absl::Status error;
  for (const BlockRun& run : frame.runs) {
    absl::StatusOr<WriteGrant> g =
        core.BeginWrite(frame.tag, frame.nonce, run.dst_first, run.num_blocks, source);
    if (!g.ok()) {
      error = g.status();
      break;
    }
    grants.push_back(*std::move(g));
    if (grants.back().exp->block_bytes != frame.block_bytes) {
      error = absl::FailedPreconditionError(
          absl::StrCat("transfer tag ", frame.tag, ": sender block_bytes ", frame.block_bytes,
                       " but the announced pool has ", grants.back().exp->block_bytes));
      break;
    }
  }
  if (error.ok()) {
    return grants;
  }
  for (const WriteGrant& g : grants) {
    core.EndWrite(g, false, error);
  }
  return error;
}

namespace {

// Moves `n` bytes at `p` over `fd` (send or receive) in timeout slices: Cancelled once
// `keep_going` (when set) turns false, DeadlineExceeded once `deadline` passed.
absl::Status MoveAll(bool send, int fd, char* p, size_t n, absl::Time deadline,
                     const std::function<bool()>& keep_going) {
  bool stopped = false;
  auto go_on = [&] {
    if (keep_going && !keep_going()) {
      stopped = true;
      return false;
    }
    return absl::Now() < deadline;
  };
  int error = 0;
  const SocketIo r = send ? transport_internal::WriteAll(fd, {{p, n}}, go_on, &error)
                          : transport_internal::ReadFull(fd, p, n, go_on, &error);
  const char* what = send ? "send" : "recv";
  switch (r) {
    case SocketIo::kOk:
      return absl::OkStatus();
    case SocketIo::kClosed:
      return absl::UnavailableError("nccl control connection closed by the peer");
    case SocketIo::kFailed:
      return absl::UnavailableError(
          absl::StrCat("nccl control connection ", what, ": ", std::strerror(error)));
    case SocketIo::kStopped:
      break;
  }
  if (stopped) {
    return absl::CancelledError("nccl control connection: stopped");
  }
  return absl::DeadlineExceededError(absl::StrCat("nccl control connection: ", what, " timed out"));
}

}  // namespace

absl::Status WriteFrame(int fd, FrameType type, absl::string_view body, absl::Time deadline) {
  std::string bytes = EncodeFrame(type, body);
  return MoveAll(/*send=*/true, fd, bytes.data(), bytes.size(), deadline, nullptr);
}

absl::StatusOr<Frame> ReadFrame(int fd, absl::Time deadline,
                                const std::function<bool()>& keep_going) {
  char header[kFrameHeaderBytes];
  absl::Status s = MoveAll(/*send=*/false, fd, header, sizeof(header), deadline, keep_going);
  if (!s.ok()) {
    return s;
  }
  absl::StatusOr<FrameHeader> h = DecodeFrameHeader(absl::string_view(header, sizeof(header)));
  if (!h.ok()) {
    return h.status();
  }
  Frame f;
  f.type = h->type;
  f.body.resize(h->body_bytes);
  s = MoveAll(/*send=*/false, fd, f.body.data(), f.body.size(), deadline, keep_going);
  if (!s.ok()) {
    return s;
  }
  return f;
}

}  // namespace pd::transport::nccl_internal
