#include "transport/testing/fault_injecting_transport.h"

#include <cstring>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "transport/testing/loopback_transport.h"

namespace pd::transport {
namespace {

PoolGeometry Geo() {
  PoolGeometry g;
  g.dtype = "f32";
  g.block_bytes = 64;
  g.num_blocks = 16;
  return g;
}

class FaultTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto hub = std::make_shared<LoopbackHub>();
    receiver_ = LoopbackTransport::Create(hub);
    auto f = std::make_unique<FaultInjectingTransport>(LoopbackTransport::Create(hub),
                                                       FaultPolicy{}, &clock_);
    sender_ = f.get();
    owned_ = std::move(f);
    src_.assign(64 * 16, 'a');
    dst_.assign(64 * 16, 'z');
    src_h_ =
        *sender_->Register(MemoryRegion{src_.data(), src_.size(), MemoryKind::kHost, 0, Geo()});
    dst_h_ =
        *receiver_->Register(MemoryRegion{dst_.data(), dst_.size(), MemoryKind::kHost, 0, Geo()});
    peer_ = *sender_->Connect(receiver_->LocalEndpoint());
  }

  // Announces `n` blocks from 0 and posts them. Returns the post result and the expectation.
  std::pair<absl::StatusOr<TransferId>, Expectation> Post(uint64_t tag, uint32_t n) {
    std::vector<BlockId> blocks;
    std::vector<BlockPair> pairs;
    for (uint32_t i = 0; i < n; ++i) {
      blocks.push_back(BlockId(i));
      pairs.push_back({BlockId(i), BlockId(i)});
    }
    Expectation e = *receiver_->ExpectTransfer(tag, dst_h_, blocks, {});
    return {sender_->PostTransfer(peer_, tag, src_h_, pairs, e.descriptor, {}), e};
  }

  FakeClock clock_;
  std::unique_ptr<KvTransport> receiver_;
  std::unique_ptr<KvTransport> owned_;
  FaultInjectingTransport* sender_ = nullptr;
  std::vector<char> src_, dst_;
  RegionHandle src_h_, dst_h_;
  PeerHandle peer_;
};

TEST_F(FaultTest, FailSubmit) {
  FaultPolicy p;
  p.fail_submit = absl::ResourceExhaustedError("injected");
  sender_->SetPolicy(p);
  EXPECT_EQ(Post(1, 2).first.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(dst_[0], 'z');
}

TEST_F(FaultTest, FailAfterNBlocks) {
  FaultPolicy p;
  p.fail_after_blocks = 3;
  sender_->SetPolicy(p);
  auto [first, e1] = Post(1, 2);
  ASSERT_TRUE(first.ok());
  EXPECT_EQ(sender_->Wait(*first, absl::Seconds(5))->phase, TransferPhase::kDone);
  // Within the budget the decorator forwards the post untouched: the receiver's expectation
  // completed with every byte (the loopback receiver finishes it before the sender's transfer),
  // so cancelling it is the contract's no-op on a finished transfer.
  absl::StatusOr<TransferState> r1 = receiver_->Poll(e1.id);
  ASSERT_TRUE(r1.ok()) << r1.status();
  EXPECT_EQ(r1->phase, TransferPhase::kDone);
  EXPECT_EQ(r1->bytes, 2u * 64);
  EXPECT_EQ(dst_[0], 'a');
  EXPECT_EQ(dst_[2 * 64 - 1], 'a');
  EXPECT_EQ(dst_[2 * 64], 'z');
  EXPECT_TRUE(receiver_->Cancel(e1.id).ok());
  EXPECT_EQ(receiver_->Poll(e1.id)->phase, TransferPhase::kDone);
  auto [second, e2] = Post(2, 2);  // would cross the budget of 3
  ASSERT_TRUE(second.ok());
  absl::StatusOr<TransferState> s = sender_->Poll(*second);
  EXPECT_EQ(s->phase, TransferPhase::kFailed);
  EXPECT_EQ(s->status.code(), absl::StatusCode::kUnavailable);
  EXPECT_FALSE(receiver_->Poll(e2.id)->finished());  // nothing arrived
  EXPECT_EQ(sender_->PostedBlocksForTest(), 3);
}

TEST_F(FaultTest, DelayHoldsCompletionUntilClockAdvances) {
  FaultPolicy p;
  p.delay = absl::Seconds(10);
  sender_->SetPolicy(p);
  auto [id, e] = Post(1, 1);
  ASSERT_TRUE(id.ok());
  ASSERT_EQ(receiver_->Wait(e.id, absl::Seconds(5))->phase, TransferPhase::kDone);
  EXPECT_EQ(sender_->Poll(*id)->phase, TransferPhase::kPending);
  std::thread waiter(
      [&] { EXPECT_EQ(sender_->Wait(*id, absl::Seconds(20))->phase, TransferPhase::kDone); });
  clock_.BlockUntilSleepersForTest(1);
  clock_.Advance(absl::Seconds(10));
  waiter.join();
}

TEST_F(FaultTest, DropPeers) {
  FaultPolicy p;
  p.delay = absl::Seconds(10);  // keeps the transfer pending from the caller's view
  sender_->SetPolicy(p);
  auto [id, e] = Post(1, 1);
  ASSERT_TRUE(id.ok());
  ASSERT_EQ(sender_->Poll(*id)->phase, TransferPhase::kPending);
  p.drop_peers = true;
  sender_->SetPolicy(p);
  absl::StatusOr<TransferState> s = sender_->Wait(*id, absl::Seconds(5));
  EXPECT_EQ(s->phase, TransferPhase::kFailed);
  EXPECT_EQ(s->status.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(sender_->Connect(receiver_->LocalEndpoint()).status().code(),
            absl::StatusCode::kUnavailable);
  EXPECT_EQ(Post(2, 1).first.status().code(), absl::StatusCode::kUnavailable);
}

TEST_F(FaultTest, CorruptStatus) {
  FaultPolicy p;
  p.corrupt_status = absl::DataLossError("lost ack");
  sender_->SetPolicy(p);
  auto [id, e] = Post(1, 1);
  ASSERT_TRUE(id.ok());
  absl::StatusOr<TransferState> s = sender_->Wait(*id, absl::Seconds(5));
  EXPECT_EQ(s->phase, TransferPhase::kFailed);
  EXPECT_EQ(s->status.code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(receiver_->Wait(e.id, absl::Seconds(5))->phase, TransferPhase::kDone);
}

}  // namespace
}  // namespace pd::transport
