// The cluster-wide cache between two nodes' pd-tierds (issue #19 item 1): real TierdServers over
// gRPC on loopback, the tcp KV transport between them, a real redis-server as the directory, and
// worker sessions that map each node's shared-memory pool as a worker does.
#include "services/tierd/peer_link.h"

#include <grpcpp/grpcpp.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/redis/redis_client.h"
#include "common/testing/redis_server.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "pd/v1/tierd.grpc.pb.h"
#include "services/tier_shm/block_checksum.h"
#include "services/tierd/redis_index.h"
#include "services/tierd/tierd_server.h"
#include "services/tierd/tierd_test_util.h"

namespace pd::tierd {
namespace {

namespace v1 = pdserve::internal::v1;
using ::testing::HasSubstr;

BlockHash HashOf(int i) {
  std::string bytes(16, '\0');
  std::memcpy(bytes.data(), &i, sizeof(i));
  bytes[15] = 0x3c;
  return *BlockHash::FromBytes(bytes);
}

std::string Hashes(int first, int n) {
  std::vector<BlockHash> hashes;
  for (int i = first; i < first + n; ++i) hashes.push_back(HashOf(i));
  return ConcatBlockHashes(hashes);
}

// A worker's session on one tierd: attach, map the pool, offer blocks whose bytes are a
// pattern of their index, promote chains and read the slots.
class WorkerSession {
 public:
  WorkerSession(const std::string& address, const v1::KvLayout& layout) : layout_(layout) {
    stub_ =
        v1::TierService::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
    v1::AttachRequest req;
    req.set_worker_id("w");
    *req.mutable_layout() = layout;
    grpc::ClientContext ctx;
    EXPECT_TRUE(stub_->Attach(&ctx, req, &attach_).ok());
    auto region = tier_shm::MapDramPool(attach_.shm_name(), attach_.num_slots(),
                                        static_cast<int64_t>(attach_.slot_bytes()));
    EXPECT_TRUE(region.ok()) << region.status();
    if (region.ok()) region_ = *std::move(region);
  }

  const uint8_t* Slot(uint32_t slot) const { return region_->data() + slot * attach_.slot_bytes(); }

  // Offers HashOf(first..first+n), block i filled with byte i & 0xff; returns blocks stored.
  int Offer(int first, int n) {
    v1::AllocateSlotsRequest areq;
    areq.set_session_id(attach_.session_id());
    areq.set_block_hashes(Hashes(first, n));
    v1::AllocateSlotsResponse aresp;
    grpc::ClientContext actx;
    EXPECT_TRUE(stub_->AllocateSlots(&actx, areq, &aresp).ok());
    v1::CommitRequest creq;
    creq.set_session_id(attach_.session_id());
    for (int k = 0; k < aresp.grants_size(); ++k) {
      if (aresp.grants(k).status() != v1::SLOT_GRANT_STATUS_GRANTED) continue;
      const uint32_t slot = aresp.grants(k).slot();
      uint8_t* data = region_->data() + slot * attach_.slot_bytes();
      std::memset(data, (first + k) & 0xff, layout_.block_bytes());
      v1::CommitEntry* e = creq.add_entries();
      e->set_block_hash(HashOf(first + k).ToBytes());
      e->set_slot(slot);
      e->set_checksum(tier_shm::BlockChecksum(absl::MakeConstSpan(data, layout_.block_bytes())));
    }
    v1::CommitResponse cresp;
    grpc::ClientContext cctx;
    EXPECT_TRUE(stub_->Commit(&cctx, creq, &cresp).ok());
    int stored = 0;
    for (int r : cresp.results()) stored += r == v1::COMMIT_STATUS_STORED;
    return stored;
  }

  std::vector<v1::PromotedBlock> Promote(int first, int n, double recompute = 0) {
    v1::PromoteRequest req;
    req.set_session_id(attach_.session_id());
    req.set_block_hashes(Hashes(first, n));
    req.set_recompute_seconds_per_block(recompute);
    v1::PromoteResponse resp;
    grpc::ClientContext ctx;
    EXPECT_TRUE(stub_->Promote(&ctx, req, &resp).ok());
    return {resp.blocks().begin(), resp.blocks().end()};
  }

  void Release(const std::vector<v1::PromotedBlock>& blocks) {
    v1::ReleaseRequest req;
    req.set_session_id(attach_.session_id());
    for (const v1::PromotedBlock& b : blocks) req.add_slots(b.slot());
    v1::ReleaseResponse resp;
    grpc::ClientContext ctx;
    EXPECT_TRUE(stub_->Release(&ctx, req, &resp).ok());
  }

  v1::TierStats Stats() {
    v1::TierStats stats;
    grpc::ClientContext ctx;
    EXPECT_TRUE(stub_->Stats(&ctx, v1::StatsRequest(), &stats).ok());
    return stats;
  }

  v1::TierService::Stub* stub() { return stub_.get(); }
  uint64_t session_id() const { return attach_.session_id(); }

 private:
  v1::KvLayout layout_;
  std::unique_ptr<v1::TierService::Stub> stub_;
  v1::AttachResponse attach_;
  std::unique_ptr<tier_shm::ShmRegion> region_;
};

class PeerLinkTest : public ::testing::Test {
 protected:
  void SetUp() override {
    layout_ = testing::Stories260KLayout();
    auto redis = pd::testing::RedisServer::Start({});
    ASSERT_TRUE(redis.ok()) << redis.status();
    redis_ = *std::move(redis);
    rc_.host = redis_->host();
    rc_.port = redis_->port();
    rc_.key_prefix = "pdpeer:";
  }

  TierdConfig NodeConfig(const std::string& node) {
    TierdConfig c = testing::TestTierdConfig(node, 1);
    c.redis = rc_;
    c.peer_transport = "tcp";
    c.maintenance_interval = absl::Milliseconds(20);
    c.peer_fetch_timeout = absl::Seconds(2);
    return c;
  }

  std::unique_ptr<TierdServer> StartNode(const std::string& node, metrics::Registry* registry) {
    auto s = TierdServer::Start(NodeConfig(node), registry);
    EXPECT_TRUE(s.ok()) << s.status();
    return s.ok() ? *std::move(s) : nullptr;
  }

  // Waits until Redis says `node` holds HashOf(first..first+n).
  bool WaitIndexed(const std::string& node, int first, int n) {
    std::vector<BlockHash> chain;
    for (int i = first; i < first + n; ++i) chain.push_back(HashOf(i));
    const absl::Time deadline = absl::Now() + absl::Seconds(10);
    while (absl::Now() < deadline) {
      auto client = redis::RedisClient::Connect(rc_);
      if (client.ok()) {
        auto tiers = RedisIndex::Lookup(**client, node, chain);
        if (tiers.ok() && static_cast<int>(tiers->size()) == n) return true;
      }
      absl::SleepFor(absl::Milliseconds(20));
    }
    return false;
  }

  v1::KvLayout layout_;
  std::unique_ptr<pd::testing::RedisServer> redis_;
  redis::RedisConfig rc_;
  metrics::Registry registry_a_, registry_b_;
};

TEST_F(PeerLinkTest, AnotherNodesBlocksAreFetchedVerifiedAndKept) {
  std::unique_ptr<TierdServer> a = StartNode("peer-node-a", &registry_a_);
  std::unique_ptr<TierdServer> b = StartNode("peer-node-b", &registry_b_);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  WorkerSession on_a(a->address(), layout_);
  WorkerSession on_b(b->address(), layout_);
  ASSERT_EQ(on_a.Offer(0, 6), 6);
  ASSERT_EQ(on_b.Offer(0, 2), 2);  // B holds the first two itself
  ASSERT_TRUE(WaitIndexed("peer-node-a", 0, 6)) << redis_->LogTail();

  // B's chain 0..7: two local blocks, four from A, then the chain ends (nobody holds 6, 7).
  std::vector<v1::PromotedBlock> blocks = on_b.Promote(0, 8);
  ASSERT_EQ(blocks.size(), 6u);
  for (int k = 0; k < 6; ++k) {
    SCOPED_TRACE(k);
    EXPECT_EQ(blocks[k].remote(), k >= 2);
    EXPECT_EQ(blocks[k].source_tier(), v1::TIER_DRAM);
    const uint8_t* data = on_b.Slot(blocks[k].slot());
    EXPECT_EQ(tier_shm::BlockChecksum(absl::MakeConstSpan(data, layout_.block_bytes())),
              blocks[k].checksum());
    EXPECT_EQ(data[0], k);
    EXPECT_EQ(data[layout_.block_bytes() - 1], k);
  }
  on_b.Release(blocks);

  // The fetched blocks are B's own now: a second Promote finds them locally, fetches nothing.
  blocks = on_b.Promote(0, 6);
  ASSERT_EQ(blocks.size(), 6u);
  for (const v1::PromotedBlock& p : blocks) EXPECT_FALSE(p.remote());
  on_b.Release(blocks);
  ASSERT_TRUE(WaitIndexed("peer-node-b", 0, 6));

  ASSERT_NE(b->peer(), nullptr);
  const PeerLinkStats fb = b->peer()->Stats();
  EXPECT_EQ(fb.fetches_total, 1u);
  EXPECT_EQ(fb.fetched_blocks_total, 4u);
  EXPECT_EQ(fb.fetched_bytes_total, 4u * layout_.block_bytes());
  EXPECT_EQ(fb.fetch_failures_total, 0u);
  const PeerLinkStats sa = a->peer()->Stats();
  EXPECT_EQ(sa.reads_total, 1u);
  EXPECT_EQ(sa.read_blocks_total, 4u);
  EXPECT_EQ(sa.pinned_blocks, 0);  // released after the transfer
  EXPECT_EQ(sa.reads_in_flight, 0);
  EXPECT_EQ(on_a.Stats().tiers(0).pinned_blocks(), 0u);
  EXPECT_EQ(on_b.Stats().tiers(0).pinned_blocks(), 0u);
  EXPECT_THAT(registry_a_.RenderPrometheus(),
              HasSubstr("pd_tierd_peer_reads_total{result=\"ok\"} 1"));
  EXPECT_THAT(registry_b_.RenderPrometheus(), HasSubstr("pd_tierd_peer_fetched_blocks_total 4"));
  EXPECT_THAT(registry_b_.RenderPrometheus(), HasSubstr("pd_tierd_promote_remote_blocks_total 4"));
}

// The holder dies: B's Promote answers what B has (nothing) within the fetch timeout, leaks no
// slot, and counts the failure; the holder restarted and offered again serves fetches again.
TEST_F(PeerLinkTest, DeadHolderMeansRecomputeAndFetchesResumeAfterItsRestart) {
  std::unique_ptr<TierdServer> a = StartNode("peer-node-a", &registry_a_);
  std::unique_ptr<TierdServer> b = StartNode("peer-node-b", &registry_b_);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  WorkerSession on_b(b->address(), layout_);
  {
    WorkerSession on_a(a->address(), layout_);
    ASSERT_EQ(on_a.Offer(0, 4), 4);
  }
  ASSERT_TRUE(WaitIndexed("peer-node-a", 0, 4));
  a.reset();  // Redis still says node a holds the blocks (until their TTL)

  EXPECT_TRUE(on_b.Promote(0, 4).empty());
  EXPECT_EQ(b->peer()->Stats().fetch_failures_total, 1u);
  const v1::TierStats stats = on_b.Stats();
  EXPECT_EQ(stats.tiers(0).used_blocks(), 0u);  // the reservations went back
  EXPECT_EQ(stats.tiers(0).pinned_blocks(), 0u);

  a = StartNode("peer-node-a", &registry_a_);  // empty: the index is reconciled on connect
  ASSERT_NE(a, nullptr);
  WorkerSession on_a(a->address(), layout_);
  ASSERT_EQ(on_a.Offer(0, 3), 3);
  ASSERT_TRUE(WaitIndexed("peer-node-a", 0, 3));
  const std::vector<v1::PromotedBlock> blocks = on_b.Promote(0, 4);
  ASSERT_EQ(blocks.size(), 3u);
  for (int k = 0; k < 3; ++k) {
    EXPECT_TRUE(blocks[k].remote());
    EXPECT_EQ(on_b.Slot(blocks[k].slot())[0], k);
  }
  on_b.Release(blocks);
  EXPECT_EQ(a->peer()->Stats().pinned_blocks, 0);
}

// A holder that answers PeerRead only after `delay` (a stalled node); records how much time the
// caller gave the call.
class StalledHolder final : public v1::TierService::Service {
 public:
  explicit StalledHolder(absl::Duration delay) : delay_(delay) {}
  grpc::Status PeerRead(grpc::ServerContext* ctx, const v1::PeerReadRequest*,
                        v1::PeerReadResponse*) override {
    {
      absl::MutexLock lock(&mu_);
      granted_ = absl::FromChrono(ctx->deadline()) - absl::Now();
    }
    const absl::Time end = absl::Now() + delay_;
    while (absl::Now() < end && !ctx->IsCancelled()) absl::SleepFor(absl::Milliseconds(10));
    return grpc::Status(grpc::StatusCode::UNAVAILABLE, "stalled");
  }
  absl::Duration granted() {
    absl::MutexLock lock(&mu_);
    return granted_;
  }

 private:
  const absl::Duration delay_;
  absl::Mutex mu_;
  absl::Duration granted_ ABSL_GUARDED_BY(mu_) = absl::InfiniteDuration();
};

class StalledPeerTest : public PeerLinkTest {
 protected:
  // Starts the stalled holder and makes Redis say node z holds blocks 0..3 and serves there.
  void SetUp() override {
    PeerLinkTest::SetUp();
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(&stalled_);
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    auto client = redis::RedisClient::Connect(rc_);
    ASSERT_TRUE(client.ok()) << client.status();
    redis::RedisClient& c = **client;
    ASSERT_TRUE(c.Command({"SADD", c.Key("nodes"), "peer-node-z"}).ok());
    ASSERT_TRUE(
        c.Command({"SET", c.Key("peer:peer-node-z"), absl::StrCat("127.0.0.1:", port)}).ok());
    for (int i = 0; i < 4; ++i) {
      ASSERT_TRUE(
          c.Command({"SET", c.Key(absl::StrCat("blk:peer-node-z:", HashOf(i).ToHex())), "dram"})
              .ok());
    }
  }
  void TearDown() override {
    if (server_ != nullptr) server_->Shutdown(absl::ToChronoTime(absl::Now()));
  }

  // The worker's own Promote of blocks 0..3, with its deadline (TierClient's rpc_timeout) and
  // `recompute` seconds per block; answered before the deadline, with nothing.
  void PromoteNothing(TierdServer* b, WorkerSession* on_b, double recompute) {
    auto stub = v1::TierService::NewStub(
        grpc::CreateChannel(b->address(), grpc::InsecureChannelCredentials()));
    v1::PromoteResponse resp;
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Milliseconds(1500)));
    v1::PromoteRequest req;
    req.set_session_id(on_b->session_id());
    req.set_block_hashes(Hashes(0, 4));
    req.set_recompute_seconds_per_block(recompute);
    const grpc::Status s = stub->Promote(&ctx, req, &resp);
    ASSERT_TRUE(s.ok()) << s.error_message();  // not DEADLINE_EXCEEDED
    EXPECT_EQ(resp.blocks_size(), 0);
    const v1::TierStats stats = on_b->Stats();
    EXPECT_EQ(stats.tiers(0).used_blocks(), 0u);  // the reservations went back
    EXPECT_EQ(stats.tiers(0).pinned_blocks(), 0u);
  }

  StalledHolder stalled_{absl::Seconds(10)};
  std::unique_ptr<grpc::Server> server_;
};

// Without a recompute cost, the worker's Promote deadline bounds the fetch (less a margin).
TEST_F(StalledPeerTest, IsAbandonedBeforeTheWorkersDeadline) {
  std::unique_ptr<TierdServer> b = StartNode("peer-node-b", &registry_b_);
  ASSERT_NE(b, nullptr);
  WorkerSession on_b(b->address(), layout_);
  PromoteNothing(b.get(), &on_b, 0);
  EXPECT_EQ(b->peer()->Stats().fetch_failures_total, 1u);
  EXPECT_GT(stalled_.granted(), absl::Milliseconds(500));  // the 1 s fetch timeout applied
}

// With one: the chunk (4 blocks here) is due when computing it would be done, 4 x 10 ms + 5 ms,
// so the stall costs the request one chunk of recompute time, not the fetch timeout.
TEST_F(StalledPeerTest, CostsOneChunkOfRecomputeAtMost) {
  std::unique_ptr<TierdServer> b = StartNode("peer-node-b", &registry_b_);
  ASSERT_NE(b, nullptr);
  WorkerSession on_b(b->address(), layout_);
  PromoteNothing(b.get(), &on_b, 0.010);
  // 45 ms was granted; gRPC rounds a call's timeout up when it encodes it (grpc-timeout), and a
  // loaded machine delays the holder's reading of it, so the bound here only has to tell one
  // chunk of recompute from the 1 s fetch timeout (it failed at 45 ms under a parallel ctest).
  EXPECT_LE(stalled_.granted(), absl::Milliseconds(100));
  const PeerLinkStats st = b->peer()->Stats();
  EXPECT_EQ(st.decided_fetch_total, 1u);
  EXPECT_EQ(st.fetch_abandoned_total, 1u);
  EXPECT_DOUBLE_EQ(st.recompute_seconds_total, 0.040);
  EXPECT_THAT(registry_b_.RenderPrometheus(), HasSubstr("pd_tierd_peer_fetch_abandoned_total 1"));
}

// Once a holder's fetches have been measured, a worker whose recompute is faster than that gets
// no fetch; a slower one does.
TEST_F(PeerLinkTest, SlowerThanRecomputeIsNotFetched) {
  std::unique_ptr<TierdServer> a = StartNode("peer-node-a", &registry_a_);
  std::unique_ptr<TierdServer> b = StartNode("peer-node-b", &registry_b_);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  WorkerSession on_a(a->address(), layout_);
  WorkerSession on_b(b->address(), layout_);
  ASSERT_EQ(on_a.Offer(0, 6), 6);
  ASSERT_TRUE(WaitIndexed("peer-node-a", 0, 6));

  std::vector<v1::PromotedBlock> blocks = on_b.Promote(0, 2, /*recompute=*/0);  // measures
  ASSERT_EQ(blocks.size(), 2u);
  on_b.Release(blocks);
  blocks = on_b.Promote(2, 4, /*recompute=*/1e-9);  // no network is that fast
  EXPECT_TRUE(blocks.empty());
  PeerLinkStats st = b->peer()->Stats();
  EXPECT_EQ(st.decided_fetch_total, 1u);
  EXPECT_EQ(st.decided_recompute_total, 1u);
  EXPECT_GT(st.estimated_fetch_seconds_total, 0);
  EXPECT_THAT(registry_b_.RenderPrometheus(),
              HasSubstr("pd_tierd_peer_decisions_total{decision=\"recompute\"} 1"));
  // The path to node a is measured and shown.
  ASSERT_EQ(st.paths.size(), 1u);
  EXPECT_EQ(st.paths[0].node, "peer-node-a");
  EXPECT_GT(st.paths[0].bytes_per_second, 0);
  EXPECT_THAT(registry_b_.RenderPrometheus(),
              HasSubstr("pd_tierd_peer_path_bandwidth_bytes_per_second{node=\"peer-node-a\"}"));

  blocks = on_b.Promote(2, 4, /*recompute=*/10.0);  // a very slow worker: fetch
  ASSERT_EQ(blocks.size(), 4u);
  for (const v1::PromotedBlock& p : blocks) EXPECT_TRUE(p.remote());
  on_b.Release(blocks);
  st = b->peer()->Stats();
  EXPECT_EQ(st.decided_fetch_total, 2u);
  EXPECT_EQ(st.fetched_blocks_total, 6u);
  EXPECT_EQ(st.fetch_abandoned_total, 0u);
}

// --peer_fetch_policy=always: fetched however cheap the worker says computing is.
TEST_F(PeerLinkTest, AlwaysPolicyIgnoresTheRecomputeCost) {
  std::unique_ptr<TierdServer> a = StartNode("peer-node-a", &registry_a_);
  TierdConfig config = NodeConfig("peer-node-b");
  config.peer_fetch_policy = "always";
  auto b = TierdServer::Start(config, &registry_b_);
  ASSERT_NE(a, nullptr);
  ASSERT_TRUE(b.ok()) << b.status();
  WorkerSession on_a(a->address(), layout_);
  WorkerSession on_b((*b)->address(), layout_);
  ASSERT_EQ(on_a.Offer(0, 6), 6);
  ASSERT_TRUE(WaitIndexed("peer-node-a", 0, 6));
  on_b.Release(on_b.Promote(0, 2, /*recompute=*/0));  // measures
  const std::vector<v1::PromotedBlock> blocks = on_b.Promote(2, 4, /*recompute=*/1e-9);
  EXPECT_EQ(blocks.size(), 4u);
  on_b.Release(blocks);
  EXPECT_EQ((*b)->peer()->Stats().decided_recompute_total, 0u);
}

TEST_F(PeerLinkTest, PeerReadRefusesBadRequestsAndTierdsWithoutPeers) {
  std::unique_ptr<TierdServer> a = StartNode("peer-node-a", &registry_a_);
  ASSERT_NE(a, nullptr);
  WorkerSession on_a(a->address(), layout_);
  ASSERT_EQ(on_a.Offer(0, 2), 2);
  v1::PeerReadRequest req;
  req.set_block_hashes(Hashes(0, 2));
  req.add_dst_slots(0);  // one slot for two blocks
  v1::PeerReadResponse resp;
  {
    grpc::ClientContext ctx;
    const grpc::Status s = on_a.stub()->PeerRead(&ctx, req, &resp);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_THAT(s.error_message(), HasSubstr("1 dst_slots for 2 blocks"));
  }
  req.set_block_hashes("short");
  {
    grpc::ClientContext ctx;
    EXPECT_EQ(on_a.stub()->PeerRead(&ctx, req, &resp).error_code(),
              grpc::StatusCode::INVALID_ARGUMENT);
  }
  req.set_block_hashes(Hashes(0, 2));
  req.add_dst_slots(1);
  req.set_endpoint("not an endpoint");
  {
    grpc::ClientContext ctx;
    EXPECT_FALSE(on_a.stub()->PeerRead(&ctx, req, &resp).ok());
  }
  EXPECT_EQ(a->peer()->Stats().pinned_blocks, 0);  // pins taken for the bad endpoint went back
  EXPECT_EQ(on_a.Stats().tiers(0).pinned_blocks(), 0u);
  EXPECT_EQ(a->peer()->Stats().reads_failed_total, 3u);

  // A tierd without --peer_transport.
  TierdConfig plain = testing::TestTierdConfig("peer-node-c", 1);
  auto c = TierdServer::Start(plain, &registry_b_);
  ASSERT_TRUE(c.ok()) << c.status();
  auto stub = v1::TierService::NewStub(
      grpc::CreateChannel((*c)->address(), grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  const grpc::Status s = stub->PeerRead(&ctx, req, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNIMPLEMENTED);
  EXPECT_THAT(s.error_message(), HasSubstr("--peer_transport"));
}

// Garbage in the index (issue #40): a member of `nodes` that is no node name, a tier value
// pdserve never writes and a peer address that is no host:port are skipped, counted and
// logged; a good holder listed beside them is still found.
TEST_F(PeerLinkTest, DirectoryCountsGarbageAndStillFindsTheHolder) {
  auto admin = redis::RedisClient::Connect(rc_);
  ASSERT_TRUE(admin.ok()) << admin.status();
  const redis::RedisClient& c = **admin;
  const std::vector<std::vector<std::string>> writes = {
      {"SADD", c.Key(redis::kPrefixNodesKey), "bad node", "good", "odd", "nowhere"},
      {"SET", c.Key(redis::PrefixBlockKey("good", HashOf(0))), "dram"},
      {"SET", c.Key(redis::PrefixBlockKey("odd", HashOf(0))), "hbm"},
      {"SET", c.Key(redis::PrefixBlockKey("nowhere", HashOf(0))), "nvme"},
      {"SET", c.Key(redis::PrefixPeerKey("good")), "127.0.0.1:7001"},
      {"SET", c.Key(redis::PrefixPeerKey("nowhere")), "no-port-here"}};
  for (const auto& w : writes) {
    auto r = (*admin)->Command(w);
    ASSERT_TRUE(r.ok()) << r.status();
  }
  RedisPeerDirectory directory(rc_, "self", "127.0.0.1:7000", absl::Seconds(30));
  const BlockHash chain[] = {HashOf(0)};
  absl::StatusOr<PeerHolder> holder = directory.FindHolder(chain);
  ASSERT_TRUE(holder.ok()) << holder.status();
  EXPECT_EQ(holder->node, "good");
  EXPECT_EQ(holder->address, "127.0.0.1:7001");
  EXPECT_EQ(directory.garbage().total(redis::PrefixGarbage::kNodeName), 1u);
  EXPECT_EQ(directory.garbage().total(redis::PrefixGarbage::kTierValue), 1u);
  // "nowhere" and "good" hold one block each: both addresses are read, one is garbage.
  EXPECT_EQ(directory.garbage().total(redis::PrefixGarbage::kPeerAddress), 1u);
}

TEST_F(PeerLinkTest, ConfigErrorsNameTheFlag) {
  TierdConfig c = NodeConfig("peer-node-a");
  c.peer_transport = "smoke-signals";
  EXPECT_THAT(std::string(c.Validate().message()), HasSubstr("--peer_transport must be tcp"));
  c = NodeConfig("peer-node-a");
  c.redis.reset();
  EXPECT_THAT(std::string(c.Validate().message()), HasSubstr("needs --redis_address"));
  c = NodeConfig("peer-node-a");
  c.peer_max_reads = 0;
  EXPECT_THAT(std::string(c.Validate().message()), HasSubstr("--peer_max_reads"));
  c = NodeConfig("peer-node-a");
  c.peer_fetch_policy = "sometimes";
  EXPECT_THAT(std::string(c.Validate().message()), HasSubstr("--peer_fetch_policy must be"));
  c = NodeConfig("peer-node-a");
  c.peer_fetch_timeout = absl::ZeroDuration();
  EXPECT_THAT(std::string(c.Validate().message()), HasSubstr("--peer_fetch_timeout"));
}

}  // namespace
}  // namespace pd::tierd
