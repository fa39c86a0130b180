// Hermetic: the merge of Redis tier continuations into worker overlaps, the circuit breaker,
// and placement with a fake lookup.
#include "services/router/tier_credit.h"

#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "common/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "services/router/placement.h"

namespace pd::router {
namespace {

using redis::PrefixQuery;
using redis::PrefixTier;
using ::testing::ElementsAre;
using ::testing::IsEmpty;

constexpr PrefixTier kD = PrefixTier::kDram;
constexpr PrefixTier kN = PrefixTier::kNvme;

std::vector<BlockHash> Chain(int blocks) {
  std::vector<BlockHash> chain;
  for (int i = 0; i < blocks; ++i) {
    chain.push_back(BlockHash{7, static_cast<uint64_t>(i)});
  }
  return chain;
}

WorkerOverlap Overlap(const std::string& id, int64_t h, int64_t r, int64_t n) {
  WorkerOverlap o;
  o.worker_id = id;
  o.hbm_blocks = h;
  o.dram_blocks = r;
  o.nvme_blocks = n;
  return o;
}

MATCHER_P4(IsOverlap, id, h, r, n, "") {
  return arg.worker_id == id && arg.hbm_blocks == h && arg.dram_blocks == r && arg.nvme_blocks == n;
}

TEST(MergeTierContinuationTest, LongerContinuationReplacesTheReportedOne) {
  std::vector<WorkerOverlap> overlaps = {Overlap("w1", 2, 1, 0)};
  const std::vector<PrefixTier> tiers = {kD, kN, kN};
  EXPECT_TRUE(MergeTierContinuation("w1", 2, tiers, &overlaps));
  EXPECT_THAT(overlaps, ElementsAre(IsOverlap("w1", 2, 1, 2)));
}

TEST(MergeTierContinuationTest, ShorterOrEqualContinuationKeepsTheReportedOne) {
  std::vector<WorkerOverlap> overlaps = {Overlap("w1", 2, 1, 1)};
  const std::vector<PrefixTier> two = {kN, kN};
  EXPECT_FALSE(MergeTierContinuation("w1", 2, two, &overlaps));
  EXPECT_FALSE(MergeTierContinuation("w1", 2, {}, &overlaps));
  EXPECT_THAT(overlaps, ElementsAre(IsOverlap("w1", 2, 1, 1)));
}

TEST(MergeTierContinuationTest, AddsAWorkerWithoutHbmHits) {
  std::vector<WorkerOverlap> overlaps = {Overlap("w1", 3, 0, 0)};
  const std::vector<PrefixTier> tiers = {kN, kD};
  EXPECT_TRUE(MergeTierContinuation("w2", 0, tiers, &overlaps));
  EXPECT_FALSE(MergeTierContinuation("w3", 0, {}, &overlaps));
  EXPECT_THAT(overlaps, ElementsAre(IsOverlap("w1", 3, 0, 0), IsOverlap("w2", 0, 1, 1)));
}

// Answers from a table node -> tiers of the whole chain (from block 0), cut at each query's
// offset; or fails with `error`.
class FakeTierLookup : public TierLookup {
 public:
  struct State {
    absl::Mutex mu;
    std::vector<std::pair<std::string, std::vector<PrefixTier>>> nodes;
    std::vector<BlockHash> chain;
    absl::Status error;
    std::vector<std::vector<std::pair<std::string, size_t>>> calls;  // (node, offset, ...)
  };
  explicit FakeTierLookup(State* state) : state_(state) {}

  absl::StatusOr<std::vector<std::vector<PrefixTier>>> Lookup(
      absl::Span<const PrefixQuery> queries) override {
    absl::MutexLock lock(&state_->mu);
    std::vector<std::pair<std::string, size_t>> call;
    std::vector<std::vector<PrefixTier>> out;
    for (const PrefixQuery& q : queries) {
      const size_t offset =
          q.chain.empty() ? 0 : static_cast<size_t>(q.chain.data() - state_->chain.data());
      call.emplace_back(q.node, offset);
      std::vector<PrefixTier> tiers;
      for (const auto& [node, all] : state_->nodes) {
        if (node == q.node) {
          for (size_t i = offset; i < all.size() && i < offset + q.chain.size(); ++i) {
            tiers.push_back(all[i]);
          }
        }
      }
      out.push_back(std::move(tiers));
    }
    state_->calls.push_back(std::move(call));
    if (!state_->error.ok()) {
      return state_->error;
    }
    return out;
  }

 private:
  State* const state_;
};

class TierCreditTest : public ::testing::Test {
 protected:
  void SetUp() override {
    state_.chain = Chain(8);
    TierCreditConfig config;
    config.breaker_open = absl::Seconds(1);
    config.max_blocks = 4;
    auto credit = TierCredit::Create(std::make_unique<FakeTierLookup>(&state_), config, &clock_);
    ASSERT_TRUE(credit.ok()) << credit.status();
    credit_ = *std::move(credit);
  }

  FakeTierLookup::State state_;
  FakeClock clock_;
  std::unique_ptr<TierCredit> credit_;
};

TEST_F(TierCreditTest, OneLookupPerDistinctNodeAndOffsetCappedAtMaxBlocks) {
  state_.nodes = {{"node-a", {kD, kD, kN, kN, kN, kN, kN, kN}}, {"node-b", {kN}}};
  std::vector<WorkerOverlap> overlaps = {Overlap("a1", 2, 0, 0), Overlap("a2", 2, 0, 0),
                                         Overlap("b1", 1, 0, 0)};
  const std::vector<NodeWorker> workers = {
      {"a1", "node-a"}, {"a2", "node-a"}, {"b1", "node-b"}, {"b2", "node-b"}, {"x", "bad:node"}};
  credit_->Extend(state_.chain, workers, &overlaps);

  ASSERT_EQ(state_.calls.size(), 1u);  // one round trip for everyone
  EXPECT_THAT(state_.calls[0], ElementsAre(std::make_pair(std::string("node-a"), size_t{2}),
                                           std::make_pair(std::string("node-b"), size_t{1}),
                                           std::make_pair(std::string("node-b"), size_t{0})));
  // node-a from block 2: N N N N (capped at 4 of the 6 it holds).
  EXPECT_THAT(overlaps, ElementsAre(IsOverlap("a1", 2, 0, 4), IsOverlap("a2", 2, 0, 4),
                                    IsOverlap("b1", 1, 0, 0), IsOverlap("b2", 0, 0, 1)));
  const TierCreditStats stats = credit_->Stats();
  EXPECT_EQ(stats.lookups_total, 1u);
  EXPECT_EQ(stats.credited_workers_total, 3u);
  EXPECT_EQ(stats.nvme_blocks_total, 9u);
  EXPECT_EQ(stats.dram_blocks_total, 0u);
  EXPECT_FALSE(stats.breaker_open);
}

TEST_F(TierCreditTest, FailureLeavesOverlapsAloneAndOpensTheBreaker) {
  state_.nodes = {{"node-a", {kD, kD, kD}}};
  state_.error = absl::DeadlineExceededError("redis 127.0.0.1:1: MGET: timed out");
  const std::vector<WorkerOverlap> before = {Overlap("a1", 1, 0, 0)};
  std::vector<WorkerOverlap> overlaps = before;
  const std::vector<NodeWorker> workers = {{"a1", "node-a"}};
  credit_->Extend(state_.chain, workers, &overlaps);
  EXPECT_THAT(overlaps, ElementsAre(IsOverlap("a1", 1, 0, 0)));
  EXPECT_EQ(credit_->Stats().errors_total, 1u);
  EXPECT_TRUE(credit_->Stats().breaker_open);

  // While open: no lookup at all.
  state_.error = absl::OkStatus();
  credit_->Extend(state_.chain, workers, &overlaps);
  EXPECT_EQ(state_.calls.size(), 1u);
  EXPECT_EQ(credit_->Stats().skipped_total, 1u);
  EXPECT_THAT(overlaps, ElementsAre(IsOverlap("a1", 1, 0, 0)));

  // After breaker_open the next request asks again and gets the credit.
  clock_.Advance(absl::Seconds(1));
  credit_->Extend(state_.chain, workers, &overlaps);
  EXPECT_EQ(state_.calls.size(), 2u);
  EXPECT_THAT(overlaps, ElementsAre(IsOverlap("a1", 1, 2, 0)));
  EXPECT_FALSE(credit_->Stats().breaker_open);
}

TEST_F(TierCreditTest, BusyConnectionsSkipWithoutOpeningTheBreaker) {
  state_.nodes = {{"node-a", {kD}}};
  state_.error = absl::ResourceExhaustedError("all 4 redis tier lookup connections are busy");
  std::vector<WorkerOverlap> overlaps;
  credit_->Extend(state_.chain, {{"a1", "node-a"}}, &overlaps);
  EXPECT_THAT(overlaps, IsEmpty());
  EXPECT_EQ(credit_->Stats().skipped_total, 1u);
  EXPECT_EQ(credit_->Stats().errors_total, 0u);
  EXPECT_FALSE(credit_->Stats().breaker_open);
}

TEST_F(TierCreditTest, NothingToAskMeansNoLookup) {
  std::vector<WorkerOverlap> overlaps = {Overlap("a1", 8, 0, 0)};  // whole chain in HBM
  credit_->Extend(state_.chain, {{"a1", "node-a"}, {"b1", ""}}, &overlaps);
  credit_->Extend({}, {{"a1", "node-a"}}, &overlaps);
  EXPECT_TRUE(state_.calls.empty());
  EXPECT_EQ(credit_->Stats().lookups_total, 0u);
}

TEST(TierCreditConfigTest, Validates) {
  TierCreditConfig c;
  EXPECT_TRUE(c.Validate().ok());
  c.breaker_open = absl::ZeroDuration();
  EXPECT_EQ(c.Validate().code(), absl::StatusCode::kInvalidArgument);
  c = TierCreditConfig();
  c.max_blocks = 0;
  EXPECT_EQ(c.Validate().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(TierCredit::Create(nullptr, {}).status().code(), absl::StatusCode::kInvalidArgument);
}

// Placement: lower-tier blocks on a worker's node move the request there.
TEST(TierCreditPlacementTest, NodeTierHitsChangeTheDecodeWorker) {
  FakeTierLookup::State state;
  state.chain = Chain(8);
  state.nodes = {{"node-b", {kD, kD, kD, kD, kN, kN, kN, kN}}};
  auto credit = TierCredit::Create(std::make_unique<FakeTierLookup>(&state), {});
  ASSERT_TRUE(credit.ok());
  RouterConfig c;
  c.model = "m";
  c.decode_workers = {"x"};
  c.block_size = 4;
  auto policy = MakePlacementPolicy(c, nullptr, credit->get());
  ASSERT_TRUE(policy.ok()) << policy.status();
  std::vector<WorkerSnapshot> workers(2);
  for (int i = 0; i < 2; ++i) {
    workers[i].index = i;
    workers[i].worker_id = i == 0 ? "d0" : "d1";
    workers[i].node_name = i == 0 ? "node-a" : "node-b";
    workers[i].healthy = true;
    workers[i].can_decode = true;
    workers[i].load.set_total_kv_blocks(1000);
    workers[i].load.set_free_kv_blocks(1000);
  }
  for (int i = 0; i < 4; ++i) {
    absl::StatusOr<Placement> p = (*policy)->Choose(state.chain, 8 * 4, workers);
    ASSERT_TRUE(p.ok()) << p.status();
    EXPECT_EQ(p->decode_index, 1);
    EXPECT_EQ(p->cached_blocks, 8);
    EXPECT_EQ(p->reason, "cache_hit");
  }
}

}  // namespace
}  // namespace pd::router
