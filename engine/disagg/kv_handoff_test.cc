#include "engine/disagg/kv_handoff.h"

#include <cstring>
#include <vector>

#include "absl/synchronization/notification.h"
#include "engine/memory/host_kv_pool.h"
#include "engine/memory/tp_kv_pool.h"
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

// A side whose pool has no single region: `ranks` per-rank pools (memory::TpKvPool, one head
// each when 2), registered staged with `staging` blocks.
struct StagedSide {
  std::unique_ptr<memory::TpKvPool> pool;
  std::unique_ptr<KvHandoff> handoff;
};

StagedSide MakeStagedSide(int64_t num_blocks, int ranks, int64_t staging) {
  StagedSide s;
  std::vector<memory::TpKvPool::RankHeads> heads;
  for (int r = 0; r < ranks; ++r) heads.push_back({r * 2 / ranks, 2 / ranks});
  absl::StatusOr<std::unique_ptr<memory::TpKvPool>> pool =
      memory::TpKvPool::CreateHost(Layout(), num_blocks, heads);
  EXPECT_TRUE(pool.ok()) << pool.status();
  s.pool = *std::move(pool);
  absl::StatusOr<transport::PoolGeometry> g = GeometryFor(Layout(), kFingerprint, num_blocks);
  EXPECT_TRUE(g.ok()) << g.status();
  KvHandoffConfig config;
  config.transport.backend = "tcp";
  absl::StatusOr<std::unique_ptr<KvHandoff>> h = KvHandoff::CreateUnregistered(config);
  EXPECT_TRUE(h.ok()) << h.status();
  s.handoff = *std::move(h);
  absl::Status r = s.handoff->RegisterStagedPool(s.pool.get(), staging, *g);
  EXPECT_TRUE(r.ok()) << r;
  return s;
}

std::vector<uint8_t> BlockBytes(uint32_t seed) {
  std::vector<uint8_t> b(static_cast<size_t>(Layout().block_bytes()));
  for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<uint8_t>(i * 13 + seed * 101 + 1);
  return b;
}

// Sends `pairs` from `p` to `d` (which announced `dst`); both states.
std::pair<transport::TransferState, transport::TransferState> Move(
    KvHandoff* p, KvHandoff* d, const std::vector<BlockId>& dst, const std::vector<BlockId>& src) {
  const uint64_t tag = d->NextTag();
  std::vector<BlockId> wire;
  absl::StatusOr<transport::Expectation> e = d->Expect(tag, dst, absl::Seconds(10), &wire);
  EXPECT_TRUE(e.ok()) << e.status();
  if (!e.ok()) return {};
  EXPECT_EQ(wire.size(), dst.size());
  std::vector<transport::BlockPair> pairs;
  for (size_t i = 0; i < src.size(); ++i) pairs.push_back({src[i], wire[i]});
  absl::StatusOr<TransferId> t =
      p->Send(d->endpoint(), tag, pairs, e->descriptor, absl::Seconds(10));
  EXPECT_TRUE(t.ok()) << t.status();
  if (!t.ok()) return {};
  absl::Notification sent, arrived;
  std::pair<transport::TransferState, transport::TransferState> states;
  p->WhenDone(*t, absl::Now() + absl::Seconds(30), [&](const transport::TransferState& s) {
    states.first = s;
    sent.Notify();
  });
  d->WhenDone(e->id, absl::Now() + absl::Seconds(30), [&](const transport::TransferState& s) {
    states.second = s;
    arrived.Notify();
  });
  EXPECT_TRUE(sent.WaitForNotificationWithTimeout(absl::Seconds(30)));
  EXPECT_TRUE(arrived.WaitForNotificationWithTimeout(absl::Seconds(30)));
  return states;
}

// Per-rank pools on both sides, and against a plain pool each way (TP 2 -> 1, 1 -> 2, 2 -> 2):
// the decode side's ranks hold exactly the prefill side's blocks, each head on its rank, and
// every staging block is free again once the transfer is done.
TEST(KvHandoffTest, StagedPoolsMoveBlocksBetweenAnyRankLayouts) {
  Side plain_p = MakeSide(8, 0);
  Side plain_d = MakeSide(8, 0xee);
  StagedSide ranks_p = MakeStagedSide(8, 2, 4);
  StagedSide ranks_d = MakeStagedSide(8, 2, 4);
  const size_t bb = static_cast<size_t>(Layout().block_bytes());
  for (uint32_t b = 0; b < 8; ++b) {
    const std::vector<uint8_t> bytes = BlockBytes(b);
    std::memcpy(plain_p.pool.data() + b * bb, bytes.data(), bb);
    ASSERT_TRUE(ranks_p.pool->WriteBlock(BlockId(b), bytes.data()).ok());
  }
  const std::vector<BlockId> src = {BlockId(2), BlockId(7), BlockId(4)};
  const std::vector<BlockId> dst = {BlockId(5), BlockId(0), BlockId(1)};
  struct Pair {
    KvHandoff* p;
    KvHandoff* d;
    const char* name;
  };
  for (const Pair& pair : {Pair{ranks_p.handoff.get(), plain_d.handoff.get(), "2 -> 1"},
                           Pair{plain_p.handoff.get(), ranks_d.handoff.get(), "1 -> 2"},
                           Pair{ranks_p.handoff.get(), ranks_d.handoff.get(), "2 -> 2"}}) {
    SCOPED_TRACE(pair.name);
    const auto [sent, arrived] = Move(pair.p, pair.d, dst, src);
    EXPECT_EQ(sent.phase, transport::TransferPhase::kDone) << sent.status;
    EXPECT_EQ(arrived.phase, transport::TransferPhase::kDone) << arrived.status;
    for (size_t i = 0; i < dst.size(); ++i) {
      std::vector<uint8_t> got(bb);
      if (pair.d == plain_d.handoff.get()) {
        std::memcpy(got.data(), plain_d.pool.data() + dst[i].value() * bb, bb);
      } else {
        ASSERT_TRUE(ranks_d.pool->ReadBlock(dst[i], got.data()).ok());
      }
      EXPECT_EQ(got, BlockBytes(src[i].value())) << "block " << dst[i].value();
    }
  }
  EXPECT_EQ(ranks_p.handoff->staging_stats().free_blocks, 4);
  EXPECT_EQ(ranks_d.handoff->staging_stats().free_blocks, 4);
  // A transfer's staging blocks ascend from the lowest free one (the transport coalesces runs).
  std::vector<BlockId> wire;
  absl::StatusOr<transport::Expectation> e = ranks_d.handoff->Expect(
      ranks_d.handoff->NextTag(), {BlockId(6), BlockId(2), BlockId(3)}, absl::Seconds(10), &wire);
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(wire, (std::vector<BlockId>{BlockId(0), BlockId(1), BlockId(2)}));
  ASSERT_TRUE(ranks_d.handoff->Cancel(e->id).ok());
  // Rank 1 of the decode side holds head 1 of block 5: the second half of each layer's part.
  std::vector<uint8_t> rank1(ranks_d.pool->rank(1)->block_bytes());
  ASSERT_TRUE(ranks_d.pool->rank(1)->ReadBlock(BlockId(5), rank1.data()).ok());
  const kvcache::KvLayout l = Layout();
  const std::vector<uint8_t> want = BlockBytes(2);
  EXPECT_EQ(std::memcmp(rank1.data(), want.data() + l.ByteOffset(0, kvcache::KvPart::kKey, 1, 0),
                        static_cast<size_t>(l.head_stride() * 4)),
            0);
}

// More blocks than the staging area has free: ResourceExhausted naming the numbers, on both
// sides, and nothing taken; a block outside the pool is InvalidArgument. A cancelled
// expectation copies nothing into the pool and frees its staging blocks.
TEST(KvHandoffTest, StagedPoolsRefuseWhatTheStagingAreaCannotHoldAndCancelCleanly) {
  StagedSide d = MakeStagedSide(8, 2, 2);
  StagedSide p = MakeStagedSide(8, 2, 2);
  absl::Status s =
      d.handoff
          ->Expect(d.handoff->NextTag(), {BlockId(0), BlockId(1), BlockId(2)}, absl::Seconds(10))
          .status();
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_THAT(s.message(),
              HasSubstr("a transfer of 3 blocks needs as many staging blocks, 2 of 2"));
  EXPECT_EQ(d.handoff->staging_stats().free_blocks, 2);
  EXPECT_EQ(
      d.handoff->Expect(d.handoff->NextTag(), {BlockId(8)}, absl::Seconds(10)).status().code(),
      absl::StatusCode::kInvalidArgument);

  const uint64_t tag = d.handoff->NextTag();
  std::vector<BlockId> wire;
  absl::StatusOr<transport::Expectation> e =
      d.handoff->Expect(tag, {BlockId(3)}, absl::Seconds(10), &wire);
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(d.handoff->staging_stats().free_blocks, 1);
  absl::Notification done;
  transport::TransferState state;
  d.handoff->WhenDone(e->id, absl::Now() + absl::Seconds(30),
                      [&](const transport::TransferState& st) {
                        state = st;
                        done.Notify();
                      });
  ASSERT_TRUE(d.handoff->Cancel(e->id).ok());
  ASSERT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(30)));
  EXPECT_EQ(state.phase, transport::TransferPhase::kFailed);
  EXPECT_EQ(d.handoff->staging_stats().free_blocks, 2);
  std::vector<uint8_t> got(static_cast<size_t>(Layout().block_bytes()), 1);
  ASSERT_TRUE(d.pool->ReadBlock(BlockId(3), got.data()).ok());
  EXPECT_EQ(got, std::vector<uint8_t>(got.size(), 0));

  std::vector<transport::BlockPair> pairs = {
      {BlockId(0), BlockId(0)}, {BlockId(1), BlockId(1)}, {BlockId(2), BlockId(0)}};
  s = p.handoff->Send(d.handoff->endpoint(), 1, pairs, e->descriptor, absl::Seconds(1)).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_EQ(p.handoff->staging_stats().free_blocks, 2);
}

}  // namespace
}  // namespace pd::disagg
