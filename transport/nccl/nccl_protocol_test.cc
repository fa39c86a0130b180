// Unit tests of the NCCL backend's host-side protocol (no GPU needed): frame encoding, the
// receiver's all-or-nothing validation of a batch, and frame I/O over a socket pair.
#include "transport/nccl/nccl_protocol.h"

#include <sys/socket.h>
#include <unistd.h>

#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pd::transport::nccl_internal {
namespace {

using ::testing::HasSubstr;
using transport_internal::PreparedPost;
using transport_internal::TransportCore;
using transport_internal::WriteGrant;

TEST(NcclProtocolTest, HeaderRoundTripAndRejections) {
  const std::string f = EncodeFrame(FrameType::kGo, "abc");
  ASSERT_EQ(f.size(), kFrameHeaderBytes + 3);
  absl::StatusOr<FrameHeader> h = DecodeFrameHeader(f.substr(0, kFrameHeaderBytes));
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_EQ(h->type, FrameType::kGo);
  EXPECT_EQ(h->body_bytes, 3u);

  std::string bad_magic = f;
  bad_magic[0] ^= 1;
  EXPECT_EQ(DecodeFrameHeader(bad_magic.substr(0, 16)).status().code(),
            absl::StatusCode::kInvalidArgument);
  std::string bad_type = f;
  bad_type[4] = 99;
  EXPECT_THAT(DecodeFrameHeader(bad_type.substr(0, 16)).status().message(),
              HasSubstr("unknown type 99"));
  std::string huge = f;
  const uint32_t too_big = kMaxFrameBodyBytes + 1;
  std::memcpy(huge.data() + 8, &too_big, 4);
  EXPECT_EQ(DecodeFrameHeader(huge.substr(0, 16)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(DecodeFrameHeader(f.substr(0, 7)).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(NcclProtocolTest, HelloRoundTrip) {
  HelloFrame in{kTransportProtocolVersion, 0x1234567890ull, 77};
  absl::StatusOr<HelloFrame> out = DecodeHello(EncodeHello(in));
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(out->protocol_version, in.protocol_version);
  EXPECT_EQ(out->instance_id, in.instance_id);
  EXPECT_EQ(out->expected_instance_id, 77u);
  EXPECT_FALSE(DecodeHello(EncodeHello(in) + "x").ok());
  EXPECT_FALSE(DecodeHello("short").ok());
}

TEST(NcclProtocolTest, TransferRoundTripAndMalformedBodies) {
  TransferFrame in;
  in.seq = 9;
  in.tag = 10;
  in.nonce = 11;
  in.block_bytes = 4099;
  in.runs = {{0, 5, 3}, {0, 20, 1}};
  const std::string body = EncodeTransfer(in);
  absl::StatusOr<TransferFrame> out = DecodeTransfer(body);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(out->seq, 9u);
  EXPECT_EQ(out->tag, 10u);
  EXPECT_EQ(out->nonce, 11u);
  ASSERT_EQ(out->runs.size(), 2u);
  EXPECT_EQ(out->runs[1].dst_first, 20u);
  EXPECT_EQ(out->runs[0].num_blocks, 3u);
  EXPECT_EQ(out->TotalBytes(), 4u * 4099);

  EXPECT_FALSE(DecodeTransfer(body.substr(0, body.size() - 1)).ok());  // truncated run
  EXPECT_FALSE(DecodeTransfer(body + std::string(8, '\0')).ok());      // trailing bytes
  TransferFrame empty = in;
  empty.runs.clear();
  EXPECT_FALSE(DecodeTransfer(EncodeTransfer(empty)).ok());
  TransferFrame zero_run = in;
  zero_run.runs[1].num_blocks = 0;
  EXPECT_THAT(DecodeTransfer(EncodeTransfer(zero_run)).status().message(),
              HasSubstr("run 1 is empty"));
  TransferFrame zero_bytes = in;
  zero_bytes.block_bytes = 0;
  EXPECT_FALSE(DecodeTransfer(EncodeTransfer(zero_bytes)).ok());
  TransferFrame overflow = in;
  overflow.block_bytes = uint64_t{1} << 62;
  overflow.runs = {{0, 0, 8}};
  EXPECT_THAT(DecodeTransfer(EncodeTransfer(overflow)).status().message(), HasSubstr("overflows"));
}

TEST(NcclProtocolTest, StatusRoundTrip) {
  StatusFrame in{42, absl::FailedPreconditionError("stale descriptor for tag 3")};
  absl::StatusOr<StatusFrame> out = DecodeStatus(EncodeStatus(in));
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(out->seq, 42u);
  EXPECT_EQ(out->status, in.status);
  absl::StatusOr<StatusFrame> ok = DecodeStatus(EncodeStatus({7, absl::OkStatus()}));
  ASSERT_TRUE(ok.ok());
  EXPECT_TRUE(ok->status.ok());
  // A code from a future absl is not trusted as-is.
  std::string body = EncodeStatus({1, absl::OkStatus()});
  const uint32_t code = 1000;
  std::memcpy(body.data() + 8, &code, 4);
  absl::StatusOr<StatusFrame> odd = DecodeStatus(body);
  ASSERT_TRUE(odd.ok());
  EXPECT_EQ(odd->status.code(), absl::StatusCode::kUnknown);
  EXPECT_FALSE(DecodeStatus(body.substr(0, 10)).ok());
}

// A receiver core with one host region (the core does not care where memory lives; the NCCL
// backend itself only registers device memory).
class GrantTest : public ::testing::Test {
 protected:
  void SetUp() override {
    mem_.resize(16 * 256);
    MemoryRegion r;
    r.base = mem_.data();
    r.size_bytes = mem_.size();
    r.kind = MemoryKind::kCuda;
    r.geometry.dtype = "bf16";
    r.geometry.block_bytes = 256;
    r.geometry.num_blocks = 16;
    absl::StatusOr<RegionHandle> h = core_.AddRegion(r, /*allow_cuda=*/true);
    ASSERT_TRUE(h.ok()) << h.status();
    region_ = *h;
    nonce_ = core_.GetRegion(region_)->nonce;
  }

  Expectation Expect(uint64_t tag, std::vector<uint32_t> blocks) {
    std::vector<BlockId> ids;
    for (uint32_t b : blocks) {
      ids.push_back(BlockId(b));
    }
    absl::StatusOr<Expectation> e = core_.Expect(tag, region_, ids, {});
    EXPECT_TRUE(e.ok()) << e.status();
    return e.value_or(Expectation{});
  }

  TransferFrame Frame(uint64_t tag, std::vector<BlockRun> runs) {
    TransferFrame f;
    f.seq = 1;
    f.tag = tag;
    f.nonce = nonce_;
    f.block_bytes = 256;
    f.runs = std::move(runs);
    return f;
  }

  std::vector<char> mem_;
  TransportCore core_{"nccl"};
  RegionHandle region_;
  uint64_t nonce_ = 0;
};

TEST_F(GrantTest, AcceptsAnnouncedRunsThenCompletes) {
  Expectation e = Expect(5, {2, 3, 4, 9});
  absl::StatusOr<std::vector<WriteGrant>> g =
      AcquireGrants(core_, Frame(5, {{0, 2, 3}, {0, 9, 1}}), 77);
  ASSERT_TRUE(g.ok()) << g.status();
  ASSERT_EQ(g->size(), 2u);
  EXPECT_EQ((*g)[0].dst, mem_.data() + 2 * 256);
  EXPECT_EQ((*g)[0].length, 3u * 256);
  EXPECT_EQ((*g)[1].dst, mem_.data() + 9 * 256);
  EXPECT_EQ(core_.Poll(e.id)->phase, TransferPhase::kPending);
  for (const WriteGrant& w : *g) {
    core_.EndWrite(w, true);
  }
  EXPECT_TRUE(core_.CompleteExpectation(5, nonce_).ok());
  EXPECT_EQ(core_.Poll(e.id)->phase, TransferPhase::kDone);
}

TEST_F(GrantTest, StaleNonceOnFirstRunLeavesExpectationPending) {
  Expectation e = Expect(5, {2});
  TransferFrame f = Frame(5, {{0, 2, 1}});
  f.nonce = nonce_ + 1;
  absl::StatusOr<std::vector<WriteGrant>> g = AcquireGrants(core_, f, 77);
  EXPECT_EQ(g.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(core_.Poll(e.id)->phase, TransferPhase::kPending);
  // The right nonce still works.
  EXPECT_TRUE(AcquireGrants(core_, Frame(5, {{0, 2, 1}}), 77).ok());
}

TEST_F(GrantTest, UnknownTagIsRejected) {
  EXPECT_EQ(AcquireGrants(core_, Frame(99, {{0, 0, 1}}), 77).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST_F(GrantTest, UnannouncedLaterRunReleasesEarlierGrantsAndFailsExpectation) {
  Expectation e = Expect(6, {1, 2});
  absl::StatusOr<std::vector<WriteGrant>> g =
      AcquireGrants(core_, Frame(6, {{0, 1, 1}, {0, 2, 2}}), 77);  // block 3 not announced
  EXPECT_EQ(g.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(g.status().message(), HasSubstr("block 3"));
  absl::StatusOr<TransferState> s = core_.Poll(e.id);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->phase, TransferPhase::kFailed);
  // No writer is left behind: deregistering does not block.
  EXPECT_TRUE(core_.RemoveRegion(region_).ok());
}

TEST_F(GrantTest, DuplicateRunWithinFrameRejected) {
  Expect(7, {4, 5});
  EXPECT_EQ(AcquireGrants(core_, Frame(7, {{0, 4, 2}, {0, 5, 1}}), 77).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(GrantTest, BlockSizeMismatchRejected) {
  Expectation e = Expect(8, {0});
  TransferFrame f = Frame(8, {{0, 0, 1}});
  f.block_bytes = 512;
  EXPECT_EQ(AcquireGrants(core_, f, 77).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(core_.Poll(e.id)->phase, TransferPhase::kFailed);
}

TEST_F(GrantTest, CancelledExpectationRejectsFrame) {
  Expectation e = Expect(9, {0});
  ASSERT_TRUE(core_.Cancel(e.id).ok());
  EXPECT_EQ(AcquireGrants(core_, Frame(9, {{0, 0, 1}}), 77).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST(NcclProtocolTest, MakeTransferFrameFromPost) {
  PreparedPost post;
  post.id = TransferId(31);
  post.desc.tag = 4;
  post.desc.region_nonce = 5;
  post.block_bytes = 64;
  post.runs = {{7, 1, 2}};
  TransferFrame f = MakeTransferFrame(post);
  EXPECT_EQ(f.seq, 31u);
  EXPECT_EQ(f.tag, 4u);
  EXPECT_EQ(f.nonce, 5u);
  ASSERT_EQ(f.runs.size(), 1u);
  EXPECT_EQ(f.runs[0].dst_first, 1u);
  EXPECT_EQ(f.runs[0].src_first, 0u);  // the receiver never learns source blocks
  EXPECT_EQ(f.TotalBytes(), 128u);
}

class SocketPairTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, fds_), 0);
    timeval tv{0, 20 * 1000};
    for (int fd : fds_) {
      ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
      ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
    }
  }
  void TearDown() override {
    for (int fd : fds_) {
      if (fd >= 0) {
        ::close(fd);
      }
    }
  }
  int fds_[2] = {-1, -1};
};

TEST_F(SocketPairTest, FramesArriveInOrder) {
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  ASSERT_TRUE(WriteFrame(fds_[0], FrameType::kHello, EncodeHello({1, 2, 3}), deadline).ok());
  ASSERT_TRUE(
      WriteFrame(fds_[0], FrameType::kGo, EncodeStatus({5, absl::OkStatus()}), deadline).ok());
  absl::StatusOr<Frame> a = ReadFrame(fds_[1], deadline, nullptr);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->type, FrameType::kHello);
  EXPECT_EQ(DecodeHello(a->body)->instance_id, 2u);
  absl::StatusOr<Frame> b = ReadFrame(fds_[1], deadline, nullptr);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->type, FrameType::kGo);
  EXPECT_EQ(DecodeStatus(b->body)->seq, 5u);
}

TEST_F(SocketPairTest, LargeFrameCrossesSocketBuffers) {
  TransferFrame t;
  t.seq = 1;
  t.tag = 1;
  t.nonce = 1;
  t.block_bytes = 1;
  for (uint32_t i = 0; i < 100000; ++i) {
    t.runs.push_back({0, 2 * i, 1});
  }
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  std::thread writer([&] {
    EXPECT_TRUE(WriteFrame(fds_[0], FrameType::kTransfer, EncodeTransfer(t), deadline).ok());
  });
  absl::StatusOr<Frame> f = ReadFrame(fds_[1], deadline, nullptr);
  writer.join();
  ASSERT_TRUE(f.ok()) << f.status();
  absl::StatusOr<TransferFrame> back = DecodeTransfer(f->body);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->runs.size(), 100000u);
  EXPECT_EQ(back->runs.back().dst_first, 199998u);
}

TEST_F(SocketPairTest, ClosedPeerIsUnavailableAndStopIsCancelled) {
  absl::StatusOr<Frame> stopped = ReadFrame(fds_[1], absl::InfiniteFuture(), [] { return false; });
  EXPECT_EQ(stopped.status().code(), absl::StatusCode::kCancelled);
  absl::StatusOr<Frame> late = ReadFrame(fds_[1], absl::Now(), nullptr);
  EXPECT_EQ(late.status().code(), absl::StatusCode::kDeadlineExceeded);
  ::close(fds_[0]);
  fds_[0] = -1;
  absl::StatusOr<Frame> closed = ReadFrame(fds_[1], absl::InfiniteFuture(), nullptr);
  EXPECT_EQ(closed.status().code(), absl::StatusCode::kUnavailable);
}

TEST_F(SocketPairTest, GarbageHeaderIsInvalidArgument) {
  const std::string junk(16, 'x');
  ASSERT_EQ(::send(fds_[0], junk.data(), junk.size(), 0), 16);
  EXPECT_EQ(ReadFrame(fds_[1], absl::Now() + absl::Seconds(10), nullptr).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace pd::transport::nccl_internal
