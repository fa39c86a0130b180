#include "services/router/placement.h"

#include <numeric>

#include "gtest/gtest.h"

namespace pd::router {
namespace {

namespace iv1 = pdserve::internal::v1;

constexpr int64_t kBlock = 4;

std::vector<BlockHash> Chain(int blocks, uint32_t salt = 0) {
  HashSeedInput in;
  in.model_fingerprint = "fp";
  in.kv_dtype = "f32";
  in.block_size = kBlock;
  BlockHash seed = *ComputeHashSeed(in);
  std::vector<uint32_t> tokens(blocks * kBlock);
  std::iota(tokens.begin(), tokens.end(), salt);
  return ComputeBlockHashes(seed, tokens, kBlock);
}

void Store(KvIndex& index, const std::string& worker, absl::Span<const BlockHash> chain,
           uint64_t sequence) {
  iv1::KvEventBatch batch;
  batch.set_worker_id(worker);
  batch.set_epoch(7);
  iv1::KvEvent* e = batch.add_events();
  e->set_sequence(sequence);
  e->mutable_stored()->set_block_hashes(ConcatBlockHashes(chain));
  e->mutable_stored()->set_tier(iv1::TIER_HBM);
  e->mutable_stored()->set_num_tokens(static_cast<uint32_t>(chain.size() * kBlock));
  ASSERT_TRUE(index.Apply(worker, batch).ok());
}

WorkerSnapshot Worker(int index, const std::string& id, bool decode, bool prefill) {
  WorkerSnapshot w;
  w.index = index;
  w.address = "127.0.0.1:" + std::to_string(6000 + index);
  w.worker_id = id;
  w.can_decode = decode;
  w.can_prefill = prefill;
  w.healthy = true;
  w.load.set_total_kv_blocks(1000);
  w.load.set_free_kv_blocks(1000);
  return w;
}

std::unique_ptr<PlacementPolicy> Make(const std::string& policy, const KvIndex* index,
                                      int64_t threshold = 0) {
  RouterConfig c;
  c.model = "m";
  c.decode_workers = {"x"};
  c.policy = policy;
  c.block_size = kBlock;
  c.disagg_threshold_tokens = threshold;
  absl::StatusOr<std::unique_ptr<PlacementPolicy>> p = MakePlacementPolicy(c, index);
  EXPECT_TRUE(p.ok()) << p.status();
  return *std::move(p);
}

TEST(PlacementTest, CacheAwareFollowsTheIndexedPrefix) {
  std::unique_ptr<KvIndex> index = *KvIndex::Create({});
  const std::vector<BlockHash> chain = Chain(8);
  Store(*index, "d1", chain, 1);
  std::unique_ptr<PlacementPolicy> policy = Make("cache_aware", index.get());
  EXPECT_EQ(policy->name(), "cache_aware");
  const std::vector<WorkerSnapshot> workers = {
      Worker(0, "p0", false, true), Worker(1, "d0", true, false), Worker(2, "d1", true, false)};
  for (int i = 0; i < 4; ++i) {
    absl::StatusOr<Placement> p = policy->Choose(chain, 8 * kBlock + 1, workers);
    ASSERT_TRUE(p.ok()) << p.status();
    EXPECT_EQ(p->decode_index, 2);
    EXPECT_EQ(p->reason, "cache_hit");
    EXPECT_EQ(p->cached_blocks, 8);
    EXPECT_EQ(p->prefill_index, 0);
    EXPECT_EQ(p->prefill_reason, "remote_prefill");
  }
  // A prompt the index knows nothing about is placed by load, alternating on an idle pool.
  const std::vector<BlockHash> other = Chain(8, 1000);
  absl::StatusOr<Placement> a = policy->Choose(other, 32, workers);
  absl::StatusOr<Placement> b = policy->Choose(other, 32, workers);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->reason, "load");
  EXPECT_NE(a->decode_index, b->decode_index);
}

TEST(PlacementTest, LoadOutweighsAShortPrefix) {
  std::unique_ptr<KvIndex> index = *KvIndex::Create({});
  const std::vector<BlockHash> chain = Chain(8);
  Store(*index, "d1", absl::MakeSpan(chain).subspan(0, 1), 1);
  std::unique_ptr<PlacementPolicy> policy = Make("cache_aware", index.get());
  std::vector<WorkerSnapshot> workers = {Worker(0, "d0", true, false),
                                         Worker(1, "d1", true, false)};
  workers[1].load.set_active_kv_blocks(500);
  workers[1].load.set_num_running_requests(30);
  absl::StatusOr<Placement> p = policy->Choose(chain, 8 * kBlock, workers);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->decode_index, 0);
  EXPECT_EQ(p->prefill_index, -1);
  EXPECT_EQ(p->prefill_reason, "no_prefill_worker");
}

TEST(PlacementTest, StreamsThatEndedSinceTheLoadReportNoLongerWeigh) {
  std::unique_ptr<PlacementPolicy> policy = Make("cache_aware", nullptr);
  std::vector<WorkerSnapshot> workers = {Worker(0, "d0", true, false),
                                         Worker(1, "d1", true, false)};
  // d0 reported one running request of 3 blocks, placed by this router, which has ended since.
  workers[0].load.set_num_running_requests(1);
  workers[0].load.set_active_kv_blocks(3);
  workers[0].inflight_at_report = 1;
  workers[0].assigned_blocks_at_report = 3;
  int on_d0 = 0;
  for (int i = 0; i < 10; ++i) {
    absl::StatusOr<Placement> p = policy->Choose(Chain(3, 100 * i), 12, workers);
    ASSERT_TRUE(p.ok());
    on_d0 += p->decode_index == 0 ? 1 : 0;
  }
  EXPECT_EQ(on_d0, 5) << "the stale report must not push every request to d1";
  // A stream placed since the report counts on top of it.
  workers[0].inflight_at_report = 0;
  workers[0].assigned_blocks_at_report = 0;
  workers[0].load.set_num_running_requests(0);
  workers[0].load.set_active_kv_blocks(0);
  workers[0].inflight = 1;
  workers[0].assigned_blocks = 3;
  for (int i = 0; i < 4; ++i) {
    absl::StatusOr<Placement> p = policy->Choose(Chain(3, 7000 + i), 12, workers);
    ASSERT_TRUE(p.ok());
    EXPECT_EQ(p->decode_index, 1);
    EXPECT_EQ(p->new_blocks, 3);
  }
}

// --inflight_blocks_weight reads the new blocks of the streams placed since the last report:
// d0 got one 40-block prompt, d1 two 2-block ones. Counted per stream (8 blocks each) d0 looks
// idler; counted by their blocks too, d1 is.
TEST(PlacementTest, BlocksPlacedSinceTheLoadReportCountWithTheirWeight) {
  std::vector<WorkerSnapshot> workers = {Worker(0, "d0", true, false),
                                         Worker(1, "d1", true, false)};
  workers[0].inflight = 1;
  workers[0].assigned_blocks = 40;
  workers[1].inflight = 2;
  workers[1].assigned_blocks = 4;
  for (double weight : {0.0, 1.0}) {
    RouterConfig c;
    c.model = "m";
    c.decode_workers = {"x"};
    c.block_size = kBlock;
    c.inflight_blocks_weight = weight;
    absl::StatusOr<std::unique_ptr<PlacementPolicy>> policy = MakePlacementPolicy(c, nullptr);
    ASSERT_TRUE(policy.ok()) << policy.status();
    absl::StatusOr<Placement> p = (*policy)->Choose(Chain(3, 9000), 12, workers);
    ASSERT_TRUE(p.ok());
    EXPECT_EQ(p->decode_index, weight > 0 ? 1 : 0) << weight;
  }
}

TEST(PlacementTest, ThresholdCountsTheDecodeWorkersCachedTokens) {
  std::unique_ptr<KvIndex> index = *KvIndex::Create({});
  const std::vector<BlockHash> chain = Chain(8);
  Store(*index, "d0", chain, 1);
  std::unique_ptr<PlacementPolicy> policy = Make("round_robin", index.get(), 10);
  const std::vector<WorkerSnapshot> workers = {Worker(0, "d0", true, false),
                                               Worker(1, "p0", false, true)};
  // 33 tokens, 32 cached on d0: 1 to compute, below the threshold of 10 -> local prefill.
  absl::StatusOr<Placement> p = policy->Choose(chain, 8 * kBlock + 1, workers);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->reason, "round_robin");
  EXPECT_EQ(p->prefill_index, -1);
  EXPECT_EQ(p->prefill_reason, "below_disagg_threshold");
  // Without the cache the whole prompt counts: remote prefill.
  p = policy->Choose(Chain(8, 99), 8 * kBlock + 1, workers);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->prefill_index, 1);
}

TEST(PlacementTest, IndicesAreThePoolsNotThePositions) {
  std::unique_ptr<PlacementPolicy> policy = Make("random", nullptr);
  std::vector<WorkerSnapshot> workers = {Worker(5, "d5", true, false)};
  absl::StatusOr<Placement> p = policy->Choose(Chain(2), 8, workers);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->decode_index, 5);
  EXPECT_EQ(p->reason, "random");
}

TEST(PlacementTest, NoHealthyDecodeWorkerIsUnavailable) {
  std::unique_ptr<PlacementPolicy> policy = Make("cache_aware", nullptr);
  std::vector<WorkerSnapshot> workers = {Worker(0, "d0", true, false),
                                         Worker(1, "p0", false, true)};
  workers[0].healthy = false;
  absl::StatusOr<Placement> p = policy->Choose(Chain(2), 8, workers);
  EXPECT_EQ(p.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(p.status().message().find("no healthy decode worker"), absl::string_view::npos);
}

TEST(PlacementTest, UnknownPolicyNamesTheFlag) {
  RouterConfig c;
  c.policy = "fastest";
  absl::StatusOr<std::unique_ptr<PlacementPolicy>> p = MakePlacementPolicy(c, nullptr);
  EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(p.status().message().find("--policy"), absl::string_view::npos);
}

}  // namespace
}  // namespace pd::router
