// pd-tierd's RedisIndex (writer) and pd-router's lower-tier credit (reader) against a real
// redis-server: a node's published DRAM/NVMe blocks move placements to its worker; a dead
// Redis changes nothing but that credit; Redis back (repopulated by tierd) brings it back.
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/redis/redis_client.h"
#include "common/testing/redis_server.h"
#include "common/time/clock.h"
#include "gtest/gtest.h"
#include "services/router/placement.h"
#include "services/router/tier_credit.h"
#include "services/tierd/redis_index.h"

namespace pd {
namespace {

using router::Placement;
using router::PlacementPolicy;
using router::WorkerSnapshot;

constexpr int64_t kBlock = 4;

std::vector<BlockHash> Chain(int blocks, uint64_t salt) {
  std::vector<BlockHash> chain;
  for (int i = 0; i < blocks; ++i) {
    chain.push_back(BlockHash{salt, static_cast<uint64_t>(i)});
  }
  return chain;
}

std::vector<WorkerSnapshot> Workers() {
  std::vector<WorkerSnapshot> workers(3);
  const char* ids[] = {"d0", "d1", "d2"};
  const char* nodes[] = {"node-a", "node-b", "node-c"};
  for (int i = 0; i < 3; ++i) {
    workers[i].index = i;
    workers[i].worker_id = ids[i];
    workers[i].node_name = nodes[i];
    workers[i].healthy = true;
    workers[i].can_decode = true;
    workers[i].load.set_total_kv_blocks(1000);
    workers[i].load.set_free_kv_blocks(1000);
  }
  return workers;
}

class TierCreditIntegrationTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto server = testing::RedisServer::Start({.password = "pw"});
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    redis_.port = server_->port();
    redis_.password = "pw";
    redis_.key_prefix = "pd:it:";
    redis_.connect_timeout = absl::Milliseconds(300);
    redis_.command_timeout = absl::Seconds(1);
    redis_.max_reconnect_attempts = 1;
    redis_.reconnect_backoff_initial = absl::Milliseconds(10);
    redis_.reconnect_backoff_max = absl::Milliseconds(20);
  }

  // A node's tierd holding `chain` (first half DRAM, second half NVMe) and publishing it.
  void StartNodeIndex(const std::string& node, const std::vector<BlockHash>& chain) {
    std::vector<std::pair<BlockHash, tier_shm::TierKind>> held;
    for (size_t i = 0; i < chain.size(); ++i) {
      held.emplace_back(
          chain[i], i < chain.size() / 2 ? tier_shm::TierKind::kDram : tier_shm::TierKind::kNvme);
    }
    tierd::RedisIndexConfig config;
    config.node = node;
    config.flush_interval = absl::Milliseconds(5);
    config.retry_interval = absl::Milliseconds(50);
    auto index = tierd::RedisIndex::Create(redis_, config, [held] { return held; });
    ASSERT_TRUE(index.ok()) << index.status();
    node_index_ = *std::move(index);
    ASSERT_TRUE(node_index_->Flush().ok());
  }

  // The router's policy with lower-tier credit from Redis (a generous lookup timeout: the
  // machine is shared; production uses 5 ms), or without any.
  // `*credit` (when given) is set to the policy's TierCredit, owned by the fixture.
  std::unique_ptr<PlacementPolicy> Policy(router::TierCredit** credit_out) {
    router::RouterConfig c;
    c.model = "m";
    c.decode_workers = {"x"};
    c.block_size = kBlock;
    router::TierCredit* credit = nullptr;
    if (credit_out != nullptr) {
      auto lookup = router::RedisTierLookup::Create(redis_, absl::Milliseconds(500));
      EXPECT_TRUE(lookup.ok()) << lookup.status();
      router::TierCreditConfig config;
      config.breaker_open = absl::Seconds(1);
      auto created = router::TierCredit::Create(*std::move(lookup), config, &clock_);
      EXPECT_TRUE(created.ok()) << created.status();
      credits_.push_back(*std::move(created));
      credit = credits_.back().get();
      *credit_out = credit;
    }
    auto policy = router::MakePlacementPolicy(c, nullptr, credit);
    EXPECT_TRUE(policy.ok()) << policy.status();
    return *std::move(policy);
  }

  std::unique_ptr<testing::RedisServer> server_;
  redis::RedisConfig redis_;
  FakeClock clock_;  // drives the breaker only
  std::unique_ptr<tierd::RedisIndex> node_index_;
  std::vector<std::unique_ptr<router::TierCredit>> credits_;
};

TEST_F(TierCreditIntegrationTest, PublishedTierBlocksMovePlacementAndDeadRedisOnlyRemovesCredit) {
  const std::vector<BlockHash> chain = Chain(8, 42);
  StartNodeIndex("node-b", chain);
  router::TierCredit* credit = nullptr;
  std::unique_ptr<PlacementPolicy> policy = Policy(&credit);
  const std::vector<WorkerSnapshot> workers = Workers();

  // node-b's tierd holds the whole chain (4 DRAM + 4 NVMe): every request goes to d1.
  for (int i = 0; i < 6; ++i) {
    absl::StatusOr<Placement> p = policy->Choose(chain, 8 * kBlock, workers);
    ASSERT_TRUE(p.ok()) << p.status();
    EXPECT_EQ(p->decode_index, 1);
    EXPECT_EQ(p->cached_blocks, 8);
    EXPECT_EQ(p->reason, "cache_hit");
  }
  // A prompt nobody holds is placed by load (rotating).
  absl::StatusOr<Placement> other = policy->Choose(Chain(8, 7), 8 * kBlock, workers);
  ASSERT_TRUE(other.ok());
  EXPECT_EQ(other->reason, "load");
  EXPECT_EQ(other->cached_blocks, 0);
  EXPECT_EQ(credit->Stats().credited_workers_total, 6u);
  EXPECT_EQ(credit->Stats().dram_blocks_total, 6u * 4);
  EXPECT_EQ(credit->Stats().nvme_blocks_total, 6u * 4);

  // Redis dies: placement still succeeds and decides exactly as a router without Redis does.
  ASSERT_TRUE(server_->Stop().ok());
  std::unique_ptr<PlacementPolicy> without = Policy(nullptr);
  router::TierCredit* dead_credit = nullptr;
  std::unique_ptr<PlacementPolicy> with_dead = Policy(&dead_credit);
  for (int i = 0; i < 6; ++i) {
    absl::StatusOr<Placement> a = with_dead->Choose(chain, 8 * kBlock, workers);
    absl::StatusOr<Placement> b = without->Choose(chain, 8 * kBlock, workers);
    ASSERT_TRUE(a.ok()) << a.status();
    ASSERT_TRUE(b.ok()) << b.status();
    EXPECT_EQ(a->decode_index, b->decode_index) << i;
    EXPECT_EQ(a->cached_blocks, 0);
    EXPECT_EQ(a->reason, b->reason);
    clock_.Advance(absl::Milliseconds(400));  // lets the breaker half-open now and then
  }
  EXPECT_GE(dead_credit->Stats().errors_total, 1u);
  EXPECT_GE(dead_credit->Stats().skipped_total, 1u);
  EXPECT_EQ(dead_credit->Stats().credited_workers_total, 0u);

  // Redis back, empty: tierd repopulates it; once the breaker lets a lookup through, the credit
  // returns. Bounded wait, polling.
  ASSERT_TRUE(server_->Restart().ok()) << server_->LogTail();
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  bool credited = false;
  while (!credited && absl::Now() < deadline) {
    clock_.Advance(absl::Seconds(1));
    absl::StatusOr<Placement> p = with_dead->Choose(chain, 8 * kBlock, workers);
    ASSERT_TRUE(p.ok()) << p.status();
    credited = p->decode_index == 1 && p->cached_blocks == 8;
    if (!credited) {
      absl::SleepFor(absl::Milliseconds(20));
    }
  }
  EXPECT_TRUE(credited) << "errors=" << dead_credit->Stats().errors_total
                        << " lookups=" << dead_credit->Stats().lookups_total
                        << " skipped=" << dead_credit->Stats().skipped_total
                        << " credited=" << dead_credit->Stats().credited_workers_total
                        << " index connected=" << node_index_->Stats().connected;
  EXPECT_FALSE(dead_credit->Stats().breaker_open);
}

}  // namespace
}  // namespace pd
