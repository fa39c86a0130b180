#include "engine/disagg/kv_handoff.h"

#include <cstring>
#include <vector>

#include "absl/synchronization/notification.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pd::disagg {
namespace {

using ::testing::HasSubstr;

constexpr char kFingerprint[] = "0123456789abcdef0123";

kvcache::KvLayout Layout() { return {2, 2, 4, 16, kernels::DType::kF32}; }

struct Side {
  std::vector<uint8_t> pool;
  std::unique_ptr<KvHandoff> handoff;
};

Side MakeSide(int64_t num_blocks, uint8_t fill) {
  Side s;
  absl::StatusOr<transport::PoolGeometry> g = GeometryFor(Layout(), kFingerprint, num_blocks);
  EXPECT_TRUE(g.ok()) << g.status();
  s.pool.assign(g->block_bytes * num_blocks, fill);
  KvHandoffConfig config;
  config.transport.backend = "tcp";
  absl::StatusOr<std::unique_ptr<KvHandoff>> h =
      KvHandoff::Create(config, s.pool.data(), s.pool.size(), *g);
  EXPECT_TRUE(h.ok()) << h.status();
  s.handoff = *std::move(h);
  return s;
}

TEST(KvHandoffTest, GeometryForChecksFingerprint) {
  EXPECT_THAT(GeometryFor(Layout(), "abc", 4).status().message(), HasSubstr("fingerprint"));
  absl::StatusOr<transport::PoolGeometry> g = GeometryFor(Layout(), kFingerprint, 4);
  ASSERT_TRUE(g.ok());
  EXPECT_EQ(g->model_fingerprint, 0x0123456789abcdefull);
  EXPECT_EQ(g->block_bytes, 2u * 2 * 2 * 16 * 4 * 4);
}

TEST(KvHandoffTest, PrefillWritesIntoDecodeBlocksAndBothComplete) {
  Side p = MakeSide(8, 0);
  Side d = MakeSide(8, 0xee);
  const size_t bb = p.handoff->geometry().block_bytes;
  for (size_t i = 0; i < p.pool.size(); ++i) {
    p.pool[i] = static_cast<uint8_t>(i * 7 + 3);
  }
  const std::vector<BlockId> dst = {BlockId(5), BlockId(6), BlockId(1)};
  const uint64_t tag = d.handoff->NextTag();
  absl::StatusOr<transport::Expectation> e = d.handoff->Expect(tag, dst, absl::Seconds(10));
  ASSERT_TRUE(e.ok()) << e.status();
  std::vector<transport::BlockPair> pairs = {
      {BlockId(2), BlockId(5)}, {BlockId(3), BlockId(6)}, {BlockId(7), BlockId(1)}};
  absl::StatusOr<TransferId> t =
      p.handoff->Send(d.handoff->endpoint(), tag, pairs, e->descriptor, absl::Seconds(10));
  ASSERT_TRUE(t.ok()) << t.status();
  absl::Notification sent, arrived;
  transport::TransferState send_state, recv_state;
  p.handoff->WhenDone(*t, absl::Now() + absl::Seconds(30), [&](const transport::TransferState& s) {
    send_state = s;
    sent.Notify();
  });
  d.handoff->WhenDone(e->id, absl::Now() + absl::Seconds(30),
                      [&](const transport::TransferState& s) {
                        recv_state = s;
                        arrived.Notify();
                      });
  ASSERT_TRUE(sent.WaitForNotificationWithTimeout(absl::Seconds(30)));
  ASSERT_TRUE(arrived.WaitForNotificationWithTimeout(absl::Seconds(30)));
  EXPECT_EQ(send_state.phase, transport::TransferPhase::kDone) << send_state.status;
  EXPECT_EQ(recv_state.phase, transport::TransferPhase::kDone) << recv_state.status;
  for (const auto& pair : pairs) {
    EXPECT_EQ(std::memcmp(d.pool.data() + pair.dst.value() * bb,
                          p.pool.data() + pair.src.value() * bb, bb),
              0);
  }
  EXPECT_EQ(d.pool[0], 0xee);  // untouched block
}

TEST(KvHandoffTest, ExpectationPastDeadlineFailsAndIsCancelled) {
  Side d = MakeSide(4, 0);
  const uint64_t tag = d.handoff->NextTag();
  absl::StatusOr<transport::Expectation> e =
      d.handoff->Expect(tag, {BlockId(0)}, absl::Seconds(30));
  ASSERT_TRUE(e.ok());
  absl::Notification done;
  transport::TransferState state;
  d.handoff->WhenDone(e->id, absl::Now() + absl::Milliseconds(50),
                      [&](const transport::TransferState& s) {
                        state = s;
                        done.Notify();
                      });
  ASSERT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(30)));
  EXPECT_EQ(state.phase, transport::TransferPhase::kFailed);
  EXPECT_EQ(state.status.code(), absl::StatusCode::kDeadlineExceeded);
}

TEST(KvHandoffTest, PendingCallbacksRunOnDestruction) {
  Side d = MakeSide(4, 0);
  absl::StatusOr<transport::Expectation> e =
      d.handoff->Expect(d.handoff->NextTag(), {BlockId(0)}, absl::Seconds(30));
  ASSERT_TRUE(e.ok());
  bool called = false;
  d.handoff->WhenDone(e->id, absl::InfiniteFuture(), [&](const transport::TransferState& s) {
    called = true;
    EXPECT_EQ(s.status.code(), absl::StatusCode::kCancelled);
  });
  d.handoff.reset();
  EXPECT_TRUE(called);
}

}  // namespace
}  // namespace pd::disagg
