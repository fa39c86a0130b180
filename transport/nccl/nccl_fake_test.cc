// NcclTransport against the CPU fake of CUDA and NCCL (fake_cuda_nccl.h): the whole
// conformance suite plus the abort paths, run here without a GPU. It checks the backend's host
// logic — handshake, TRANSFER/GO/REJECT/DONE ordering, progress, pins, aborts — not NCCL
// itself; the real library runs in the gpu-labelled suites.
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"
#include "transport/conformance/conformance_suite.h"
#include "transport/nccl/fake_cuda_nccl.h"
#include "transport/nccl/nccl_transport.h"
#include "transport/testing/test_device_memory.h"

namespace pd::transport {
namespace {

using conformance::ConformanceParam;
using conformance::FillPattern;
using conformance::FirstPatternMismatch;
using conformance::KvTransportConformance;
using conformance::TestGeometry;

int DeviceOf(int index) { return index == 1 ? 1 : 0; }

absl::StatusOr<std::unique_ptr<KvTransport>> MakeFakeNccl(int index) {
  NcclTransportOptions o;
  o.device = DeviceOf(index);
  return CreateNcclTransport(o);
}

ConformanceParam FakeParam() {
  ConformanceParam p;
  p.name = "nccl_fake_cuda";
  p.make = &MakeFakeNccl;
  p.memory = MemoryKind::kCuda;
  p.device_of = &DeviceOf;
  return p;
}

INSTANTIATE_TEST_SUITE_P(Fake, KvTransportConformance, ::testing::Values(FakeParam()),
                         conformance::ParamName);

// A connected sender (device 0) / receiver (device 1) pair with one device pool each.
class NcclFakeTest : public ::testing::Test {
 protected:
  static constexpr uint64_t kBlockBytes = 4096;
  static constexpr uint32_t kBlocks = 16;

  void SetUp() override {
    fake_cuda::PauseCopies(false);
    absl::StatusOr<std::unique_ptr<KvTransport>> a = MakeFakeNccl(0);
    absl::StatusOr<std::unique_ptr<KvTransport>> b = MakeFakeNccl(1);
    ASSERT_TRUE(a.ok() && b.ok());
    sender_ = *std::move(a);
    receiver_ = *std::move(b);
    absl::StatusOr<PeerHandle> p = sender_->Connect(receiver_->LocalEndpoint());
    ASSERT_TRUE(p.ok()) << p.status();
    peer_ = *p;
    src_ = Pool(*sender_, 0, true);
    dst_ = Pool(*receiver_, 1, false);
  }

  void TearDown() override { fake_cuda::PauseCopies(false); }

  struct DevicePool {
    std::unique_ptr<TestDeviceBuffer> buf;
    RegionHandle handle;
  };

  DevicePool Pool(KvTransport& t, int device, bool pattern) {
    DevicePool p;
    absl::StatusOr<TestDeviceBuffer> b = TestDeviceBuffer::Allocate(kBlockBytes * kBlocks, device);
    EXPECT_TRUE(b.ok()) << b.status();
    p.buf = std::make_unique<TestDeviceBuffer>(*std::move(b));
    std::vector<char> host(kBlockBytes * kBlocks, static_cast<char>(0xEE));
    if (pattern) {
      for (uint32_t i = 0; i < kBlocks; ++i) {
        FillPattern(42, i, host.data() + i * kBlockBytes, kBlockBytes);
      }
    }
    EXPECT_TRUE(p.buf->CopyFromHost(0, host.data(), host.size()).ok());
    absl::StatusOr<RegionHandle> h = t.Register(MemoryRegion{
        p.buf->data(), host.size(), MemoryKind::kCuda, device, TestGeometry(kBlockBytes, kBlocks)});
    EXPECT_TRUE(h.ok()) << h.status();
    p.handle = h.value_or(RegionHandle());
    return p;
  }

  // Expects blocks 0..n-1 at the receiver and posts src i -> dst i.
  // `receiver_timeout` (default: `timeout`) bounds the expectation.
  std::pair<TransferId, TransferId> Start(uint64_t tag, uint32_t n, absl::Duration timeout,
                                          absl::Duration receiver_timeout = absl::ZeroDuration()) {
    std::vector<BlockId> blocks;
    std::vector<BlockPair> pairs;
    for (uint32_t i = 0; i < n; ++i) {
      blocks.push_back(BlockId(i));
      pairs.push_back({BlockId(i), BlockId(i)});
    }
    TransferOptions o;
    o.timeout = receiver_timeout > absl::ZeroDuration() ? receiver_timeout : timeout;
    absl::StatusOr<Expectation> e = receiver_->ExpectTransfer(tag, dst_.handle, blocks, o);
    o.timeout = timeout;
    EXPECT_TRUE(e.ok()) << e.status();
    absl::StatusOr<TransferId> id =
        sender_->PostTransfer(peer_, tag, src_.handle, pairs, e->descriptor, o);
    EXPECT_TRUE(id.ok()) << id.status();
    return {id.value_or(TransferId()), e->id};
  }

  std::unique_ptr<KvTransport> sender_;
  std::unique_ptr<KvTransport> receiver_;
  PeerHandle peer_;
  DevicePool src_;
  DevicePool dst_;
};

TEST_F(NcclFakeTest, CreateAndRegisterChecks) {
  NcclTransportOptions o;
  o.device = fake_cuda::kFakeDeviceCount;
  EXPECT_EQ(CreateNcclTransport(o).status().code(), absl::StatusCode::kInvalidArgument);
  o.device = 0;
  o.listen_host = "localhost";  // not numeric
  EXPECT_EQ(CreateNcclTransport(o).status().code(), absl::StatusCode::kInvalidArgument);

  const TransportCaps caps = sender_->Caps();
  EXPECT_TRUE(caps.cuda_memory && caps.two_sided && caps.notifications);
  EXPECT_FALSE(caps.host_memory || caps.cancel || caps.one_sided);
  std::vector<char> host(kBlockBytes * kBlocks);
  MemoryRegion r{host.data(), host.size(), MemoryKind::kHost, 0,
                 TestGeometry(kBlockBytes, kBlocks)};
  EXPECT_EQ(sender_->Register(r).status().code(), absl::StatusCode::kUnimplemented);
  r.kind = MemoryKind::kCuda;  // a host pointer claimed to be device memory
  EXPECT_EQ(sender_->Register(r).status().code(), absl::StatusCode::kInvalidArgument);
  r.base = src_.buf->data();
  r.device = 1;  // the sender serves device 0
  EXPECT_EQ(sender_->Register(r).status().code(), absl::StatusCode::kInvalidArgument);
  r.device = 0;
  r.size_bytes = src_.buf->size() + 1;  // runs past the allocation
  EXPECT_EQ(sender_->Register(r).status().code(), absl::StatusCode::kInvalidArgument);
  // Device 1 memory registered with the device 0 transport.
  r.base = dst_.buf->data();
  r.size_bytes = dst_.buf->size();
  EXPECT_EQ(sender_->Register(r).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(sender_->Connect("garbage").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(NcclFakeTest, SameDeviceOnBothEndsFailsConnect) {
  NcclTransportOptions o;
  o.device = 1;
  o.connect_timeout = absl::Seconds(2);
  absl::StatusOr<std::unique_ptr<KvTransport>> other = CreateNcclTransport(o);
  ASSERT_TRUE(other.ok());
  // receiver_ is on device 1 too: the communicator cannot be created.
  absl::StatusOr<PeerHandle> p = (*other)->Connect(receiver_->LocalEndpoint());
  EXPECT_EQ(p.status().code(), absl::StatusCode::kUnavailable) << p.status();
}

TEST_F(NcclFakeTest, CancelIsForExpectationsOnly) {
  fake_cuda::PauseCopies(true);  // hold the groups in flight
  auto [send, recv] = Start(1, 4, absl::Seconds(30));
  absl::Status c = sender_->Cancel(send);
  EXPECT_EQ(c.code(), absl::StatusCode::kUnimplemented) << c;
  fake_cuda::PauseCopies(false);
  EXPECT_EQ(sender_->Wait(send, absl::Seconds(10))->phase, TransferPhase::kDone);
  EXPECT_EQ(receiver_->Wait(recv, absl::Seconds(10))->phase, TransferPhase::kDone);
  EXPECT_TRUE(sender_->Cancel(send).ok());  // no effect on a finished transfer
}

TEST_F(NcclFakeTest, ReceiverCancelWithGroupInFlightAbortsConnection) {
  fake_cuda::PauseCopies(true);
  const int aborts = fake_cuda::AbortCount();
  auto [send, recv] = Start(2, 4, absl::Seconds(30));
  // Wait until both groups are issued (the receiver's recv, then the sender's send).
  ASSERT_TRUE(fake_cuda::WaitForPendingOps(2, 10000));
  // Cancel returns only after the in-flight receive stopped: that takes an abort.
  ASSERT_TRUE(receiver_->Cancel(recv).ok());
  EXPECT_EQ(receiver_->Poll(recv)->status.code(), absl::StatusCode::kCancelled);
  fake_cuda::PauseCopies(false);
  absl::StatusOr<TransferState> s = sender_->Wait(send, absl::Seconds(10));
  ASSERT_TRUE(s.ok());
  // Nothing was copied before the abort, so the sender cannot have completed.
  EXPECT_EQ(s->phase, TransferPhase::kFailed);
  EXPECT_EQ(s->status.code(), absl::StatusCode::kUnavailable) << s->status;
  EXPECT_GE(fake_cuda::AbortCount(), aborts + 2);  // both ends
  // Deregistering the source waits for the send group, which the abort ended.
  EXPECT_TRUE(sender_->Deregister(src_.handle).ok());
  src_ = Pool(*sender_, 0, true);
  // Connect again makes a fresh communicator and the pair works.
  absl::StatusOr<PeerHandle> p = sender_->Connect(receiver_->LocalEndpoint());
  ASSERT_TRUE(p.ok()) << p.status();
  peer_ = *p;
  auto [send2, recv2] = Start(3, 2, absl::Seconds(30));
  EXPECT_EQ(sender_->Wait(send2, absl::Seconds(10))->phase, TransferPhase::kDone);
  EXPECT_EQ(receiver_->Wait(recv2, absl::Seconds(10))->phase, TransferPhase::kDone);
}

TEST_F(NcclFakeTest, SenderTimeoutWithGroupInFlightAbortsAndDeregisterReturns) {
  fake_cuda::PauseCopies(true);
  // Only the sender times out (the receiver would otherwise race it to abort).
  auto [send, recv] = Start(4, 8, absl::Milliseconds(200), absl::Seconds(30));
  absl::StatusOr<TransferState> s = sender_->Wait(send, absl::Seconds(10));
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->phase, TransferPhase::kFailed);
  EXPECT_EQ(s->status.code(), absl::StatusCode::kDeadlineExceeded) << s->status;
  // The send group is still issued and NCCL cannot cancel it: the progress thread aborts the
  // connection, after which the source region can go.
  EXPECT_TRUE(sender_->Deregister(src_.handle).ok());
  absl::StatusOr<TransferState> r = receiver_->Wait(recv, absl::Seconds(10));
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->phase, TransferPhase::kFailed);
  // Nothing was copied while paused, and nothing is after the abort.
  fake_cuda::PauseCopies(false);
  std::vector<char> host(kBlockBytes);
  ASSERT_TRUE(dst_.buf->CopyToHost(0, host.data(), host.size()).ok());
  EXPECT_EQ(host[0], static_cast<char>(0xEE));
}

TEST_F(NcclFakeTest, ReceiverDestroyedMidBatchFailsSenderUnavailable) {
  fake_cuda::PauseCopies(true);
  auto [send, recv] = Start(5, 8, absl::Seconds(30));
  receiver_.reset();  // closes the control connection, aborts its communicator
  absl::StatusOr<TransferState> s = sender_->Wait(send, absl::Seconds(10));
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->phase, TransferPhase::kFailed);
  EXPECT_EQ(s->status.code(), absl::StatusCode::kUnavailable) << s->status;
  EXPECT_TRUE(sender_->Deregister(src_.handle).ok());
  absl::StatusOr<TransferId> again = sender_->PostTransfer(peer_, 6, src_.handle, {}, "", {});
  EXPECT_FALSE(again.ok());
}

TEST_F(NcclFakeTest, ConcurrentPostersKeepGroupsInStep) {
  // Four threads post 10 transfers each of 1..4 blocks on one connection, with copies paused
  // now and then: the groups must still pair up send-for-recv (a mismatch would be a size
  // error in the fake, or wrong bytes), and every block must hold its source's pattern.
  constexpr uint32_t kDstBlocks = 4 * 10 * 4;
  DevicePool big_src;
  DevicePool big_dst;
  {
    absl::StatusOr<TestDeviceBuffer> a = TestDeviceBuffer::Allocate(kBlockBytes * kBlocks, 0);
    absl::StatusOr<TestDeviceBuffer> b = TestDeviceBuffer::Allocate(kBlockBytes * kDstBlocks, 1);
    ASSERT_TRUE(a.ok() && b.ok());
    big_src.buf = std::make_unique<TestDeviceBuffer>(*std::move(a));
    big_dst.buf = std::make_unique<TestDeviceBuffer>(*std::move(b));
    std::vector<char> host(kBlockBytes * kBlocks);
    for (uint32_t i = 0; i < kBlocks; ++i) {
      FillPattern(42, i, host.data() + i * kBlockBytes, kBlockBytes);
    }
    ASSERT_TRUE(big_src.buf->CopyFromHost(0, host.data(), host.size()).ok());
    absl::StatusOr<RegionHandle> hs =
        sender_->Register(MemoryRegion{big_src.buf->data(), host.size(), MemoryKind::kCuda, 0,
                                       TestGeometry(kBlockBytes, kBlocks)});
    absl::StatusOr<RegionHandle> hd = receiver_->Register(
        MemoryRegion{big_dst.buf->data(), kBlockBytes * kDstBlocks, MemoryKind::kCuda, 1,
                     TestGeometry(kBlockBytes, kDstBlocks)});
    ASSERT_TRUE(hs.ok() && hd.ok());
    big_src.handle = *hs;
    big_dst.handle = *hd;
  }
  std::vector<BlockPair> all;
  absl::Mutex mu;
  std::vector<std::thread> threads;
  for (uint32_t t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (uint32_t k = 0; k < 10; ++k) {
        const uint32_t n = 1 + (t + k) % 4;
        const uint32_t dst_first = (t * 10 + k) * 4;
        std::vector<BlockId> blocks;
        std::vector<BlockPair> pairs;
        for (uint32_t i = 0; i < n; ++i) {
          blocks.push_back(BlockId(dst_first + i));
          pairs.push_back({BlockId((t * 3 + k + i) % kBlocks), BlockId(dst_first + i)});
        }
        const uint64_t tag = 1000 + t * 100 + k;
        absl::StatusOr<Expectation> e = receiver_->ExpectTransfer(tag, big_dst.handle, blocks, {});
        ASSERT_TRUE(e.ok()) << e.status();
        absl::StatusOr<TransferId> id =
            sender_->PostTransfer(peer_, tag, big_src.handle, pairs, e->descriptor, {});
        ASSERT_TRUE(id.ok()) << id.status();
        if (t == 0 && k % 3 == 0) {
          fake_cuda::PauseCopies(true);  // other threads' groups queue up meanwhile
          fake_cuda::PauseCopies(false);
        }
        EXPECT_EQ(sender_->Wait(*id, absl::Seconds(20))->phase, TransferPhase::kDone);
        EXPECT_EQ(receiver_->Wait(e->id, absl::Seconds(20))->phase, TransferPhase::kDone);
        absl::MutexLock lock(&mu);
        all.insert(all.end(), pairs.begin(), pairs.end());
      }
    });
  }
  for (std::thread& th : threads) {
    th.join();
  }
  std::vector<char> host(kBlockBytes * kDstBlocks);
  ASSERT_TRUE(big_dst.buf->CopyToHost(0, host.data(), host.size()).ok());
  ASSERT_EQ(all.size(), 100u);
  for (const BlockPair& p : all) {
    EXPECT_EQ(FirstPatternMismatch(42, p.src.value(), host.data() + p.dst.value() * kBlockBytes,
                                   kBlockBytes),
              -1)
        << "dst block " << p.dst.value();
  }
}

TEST_F(NcclFakeTest, DataArrivesOnlyInAnnouncedBlocks) {
  auto [send, recv] = Start(7, 3, absl::Seconds(30));
  ASSERT_EQ(sender_->Wait(send, absl::Seconds(10))->phase, TransferPhase::kDone);
  ASSERT_EQ(receiver_->Wait(recv, absl::Seconds(10))->phase, TransferPhase::kDone);
  std::vector<char> host(kBlockBytes * kBlocks);
  ASSERT_TRUE(dst_.buf->CopyToHost(0, host.data(), host.size()).ok());
  for (uint32_t b = 0; b < 3; ++b) {
    EXPECT_EQ(FirstPatternMismatch(42, b, host.data() + b * kBlockBytes, kBlockBytes), -1);
  }
  EXPECT_EQ(host[3 * kBlockBytes], static_cast<char>(0xEE));
}

}  // namespace
}  // namespace pd::transport
