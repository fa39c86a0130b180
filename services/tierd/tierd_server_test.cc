// TierdServer over real gRPC on loopback: sessions, the offer and restore flows through the
// mapped shared-memory pool, argument errors, spills to a real NVMe directory with the location
// index following, and a restart that finds the NVMe blocks again.
#include "services/tierd/tierd_server.h"

#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/redis/redis_client.h"
#include "common/testing/redis_server.h"
#include "common/testing/temp_dir.h"
#include "engine/runtime/model_front.h"
#include "engine/runtime/model_runtime.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "pd/v1/tierd.grpc.pb.h"
#include "services/base/kv_layout_proto.h"
#include "services/tier_shm/block_checksum.h"
#include "services/tierd/tierd_test_util.h"

namespace pd::tierd {
namespace {

namespace v1 = pdserve::internal::v1;
using ::testing::HasSubstr;

// Records the latest location of every hash the server publishes.
class RecordingSink : public LocationSink {
 public:
  void Publish(const BlockHash& hash, tier_shm::TierKind tier) override {
    absl::MutexLock lock(&mu_);
    where_[hash] = tier == tier_shm::TierKind::kDram ? "dram" : "nvme";
  }
  void Unpublish(const BlockHash& hash) override {
    absl::MutexLock lock(&mu_);
    where_[hash] = "none";
  }
  std::string Where(const BlockHash& hash) {
    absl::MutexLock lock(&mu_);
    auto it = where_.find(hash);
    return it == where_.end() ? "unknown" : it->second;
  }

 private:
  absl::Mutex mu_;
  absl::flat_hash_map<BlockHash, std::string> where_ ABSL_GUARDED_BY(mu_);
};

BlockHash HashOf(int i) {
  std::string bytes(16, '\0');
  std::memcpy(bytes.data(), &i, sizeof(i));
  bytes[15] = 0x5a;
  return *BlockHash::FromBytes(bytes);
}

std::string Bytes(const std::vector<BlockHash>& hashes) { return ConcatBlockHashes(hashes); }

class TierdServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    layout_ = testing::Stories260KLayout();
    config_ = testing::TestTierdConfig("test-node", 1);
    config_.maintenance_interval = absl::Milliseconds(5);
  }

  void StartServer() {
    auto s = TierdServer::Start(config_, &registry_, &sink_);
    ASSERT_TRUE(s.ok()) << s.status();
    server_ = *std::move(s);
    channel_ = grpc::CreateChannel(server_->address(), grpc::InsecureChannelCredentials());
    stub_ = v1::TierService::NewStub(channel_);
  }

  void StopServer() {
    stub_.reset();
    server_.reset();
  }

  // Attaches and maps the pool as a worker does.
  void Attach() {
    v1::AttachRequest req;
    req.set_worker_id("w1");
    *req.mutable_layout() = layout_;
    grpc::ClientContext ctx;
    ASSERT_TRUE(stub_->Attach(&ctx, req, &attach_).ok());
    auto region = tier_shm::MapDramPool(attach_.shm_name(), attach_.num_slots(),
                                        static_cast<int64_t>(attach_.slot_bytes()));
    ASSERT_TRUE(region.ok()) << region.status();
    region_ = *std::move(region);
  }

  uint8_t* Slot(uint32_t slot) { return region_->data() + slot * attach_.slot_bytes(); }
  absl::Span<const uint8_t> Block(uint32_t slot) {
    return absl::MakeConstSpan(Slot(slot), layout_.block_bytes());
  }

  // Offers blocks HashOf(first..first+n) filled with a pattern of their index; returns how many
  // were stored.
  int Offer(int first, int n) {
    std::vector<BlockHash> hashes;
    for (int i = first; i < first + n; ++i) hashes.push_back(HashOf(i));
    v1::AllocateSlotsRequest areq;
    areq.set_session_id(attach_.session_id());
    areq.set_block_hashes(Bytes(hashes));
    v1::AllocateSlotsResponse aresp;
    grpc::ClientContext actx;
    EXPECT_TRUE(stub_->AllocateSlots(&actx, areq, &aresp).ok());
    v1::CommitRequest creq;
    creq.set_session_id(attach_.session_id());
    for (int k = 0; k < aresp.grants_size(); ++k) {
      if (aresp.grants(k).status() != v1::SLOT_GRANT_STATUS_GRANTED) continue;
      const uint32_t slot = aresp.grants(k).slot();
      std::memset(Slot(slot), (first + k) & 0xff, layout_.block_bytes());
      v1::CommitEntry* e = creq.add_entries();
      e->set_block_hash(hashes[k].ToBytes());
      e->set_slot(slot);
      e->set_checksum(tier_shm::BlockChecksum(Block(slot)));
    }
    v1::CommitResponse cresp;
    grpc::ClientContext cctx;
    EXPECT_TRUE(stub_->Commit(&cctx, creq, &cresp).ok());
    int stored = 0;
    for (int r : cresp.results()) stored += r == v1::COMMIT_STATUS_STORED;
    return stored;
  }

  std::vector<v1::Tier> Lookup(int first, int n) {
    std::vector<BlockHash> hashes;
    for (int i = first; i < first + n; ++i) hashes.push_back(HashOf(i));
    v1::LookupRequest req;
    req.set_block_hashes(Bytes(hashes));
    v1::LookupResponse resp;
    grpc::ClientContext ctx;
    EXPECT_TRUE(stub_->Lookup(&ctx, req, &resp).ok());
    std::vector<v1::Tier> out;
    for (int t : resp.tiers()) out.push_back(static_cast<v1::Tier>(t));
    return out;
  }

  pd::testing::TempDir dir_ = *pd::testing::TempDir::Create("pd-tierd-");
  TierdConfig config_;
  v1::KvLayout layout_;
  metrics::Registry registry_;
  RecordingSink sink_;
  std::unique_ptr<TierdServer> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::TierService::Stub> stub_;
  v1::AttachResponse attach_;
  std::unique_ptr<tier_shm::ShmRegion> region_;
};

TEST_F(TierdServerTest, AttachChecksLayoutAndDescribesThePool) {
  StartServer();
  Attach();
  EXPECT_NE(attach_.session_id(), 0u);
  EXPECT_EQ(attach_.shm_name(), config_.shm_name);
  EXPECT_GE(attach_.slot_bytes(), layout_.block_bytes());
  EXPECT_EQ(attach_.slot_bytes() % 4096, 0u);
  EXPECT_EQ(attach_.num_slots(), (1u << 20) / attach_.slot_bytes());
  EXPECT_EQ(attach_.lease_ms(), 30000u);

  v1::AttachRequest req;
  req.set_worker_id("w2");
  *req.mutable_layout() = layout_;
  req.mutable_layout()->set_block_size(32);
  v1::AttachResponse resp;
  grpc::ClientContext ctx;
  grpc::Status s = stub_->Attach(&ctx, req, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(s.error_message(), HasSubstr("block_size tierd=16 worker=32"));

  req.clear_worker_id();
  grpc::ClientContext ctx2;
  EXPECT_EQ(stub_->Attach(&ctx2, req, &resp).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
}

TEST_F(TierdServerTest, OfferLookupPromoteRelease) {
  StartServer();
  Attach();
  ASSERT_EQ(Offer(0, 4), 4);
  EXPECT_EQ(Lookup(0, 6), std::vector<v1::Tier>(4, v1::TIER_DRAM));
  // Offering again: the node holds them.
  {
    v1::AllocateSlotsRequest req;
    req.set_session_id(attach_.session_id());
    req.set_block_hashes(Bytes({HashOf(1)}));
    v1::AllocateSlotsResponse resp;
    grpc::ClientContext ctx;
    ASSERT_TRUE(stub_->AllocateSlots(&ctx, req, &resp).ok());
    ASSERT_EQ(resp.grants_size(), 1);
    EXPECT_EQ(resp.grants(0).status(), v1::SLOT_GRANT_STATUS_ALREADY_HELD);
  }
  server_->FlushIndexForTest();
  EXPECT_EQ(sink_.Where(HashOf(0)), "dram");

  // Promote the chain 0,1,2,3,(miss) and read the bytes back.
  v1::PromoteRequest preq;
  preq.set_session_id(attach_.session_id());
  preq.set_block_hashes(Bytes({HashOf(0), HashOf(1), HashOf(2), HashOf(3), HashOf(99)}));
  v1::PromoteResponse presp;
  grpc::ClientContext pctx;
  ASSERT_TRUE(stub_->Promote(&pctx, preq, &presp).ok());
  ASSERT_EQ(presp.blocks_size(), 4);
  v1::ReleaseRequest rreq;
  rreq.set_session_id(attach_.session_id());
  for (int k = 0; k < 4; ++k) {
    const v1::PromotedBlock& b = presp.blocks(k);
    EXPECT_EQ(b.source_tier(), v1::TIER_DRAM);
    EXPECT_EQ(tier_shm::BlockChecksum(Block(b.slot())), b.checksum());
    EXPECT_EQ(Slot(b.slot())[0], k);
    rreq.add_slots(b.slot());
  }
  v1::ReleaseResponse rresp;
  grpc::ClientContext rctx;
  EXPECT_TRUE(stub_->Release(&rctx, rreq, &rresp).ok());

  v1::TierStats stats;
  grpc::ClientContext sctx;
  ASSERT_TRUE(stub_->Stats(&sctx, v1::StatsRequest(), &stats).ok());
  ASSERT_GE(stats.tiers_size(), 1);
  EXPECT_EQ(stats.tiers(0).tier(), v1::TIER_DRAM);
  EXPECT_EQ(stats.tiers(0).stored_blocks_total(), 4u);
  EXPECT_EQ(stats.tiers(0).hit_blocks_total(), 4u);
  EXPECT_EQ(stats.tiers(0).pinned_blocks(), 0u);
  EXPECT_EQ(stats.num_sessions(), 1u);
  EXPECT_THAT(registry_.RenderPrometheus(),
              HasSubstr("pd_tierd_hit_blocks_total{tier=\"dram\"} 4"));
}

// Unbound slots over RPC: granted after the hashes' grants, named at Commit, a held block
// answered ALREADY_HELD (the same bytes) or REFUSED (other bytes: a conflict, issue #40), and the
// total bounded by the pool.
TEST_F(TierdServerTest, UnboundSlotsAreNamedAtCommit) {
  StartServer();
  Attach();
  ASSERT_EQ(Offer(0, 1), 1);
  v1::AllocateSlotsRequest areq;
  areq.set_session_id(attach_.session_id());
  areq.set_block_hashes(Bytes({HashOf(5)}));
  areq.set_unbound_slots(2);
  v1::AllocateSlotsResponse aresp;
  grpc::ClientContext actx;
  ASSERT_TRUE(stub_->AllocateSlots(&actx, areq, &aresp).ok());
  ASSERT_EQ(aresp.grants_size(), 3);
  for (const v1::SlotGrant& g : aresp.grants()) {
    ASSERT_EQ(g.status(), v1::SLOT_GRANT_STATUS_GRANTED);
  }
  const uint32_t u1 = aresp.grants(1).slot();
  const uint32_t u2 = aresp.grants(2).slot();
  std::memset(Slot(u1), 0x42, layout_.block_bytes());
  std::memset(Slot(u2), 0x00, layout_.block_bytes());  // block 0's bytes, as Offer wrote them
  v1::CommitRequest creq;
  creq.set_session_id(attach_.session_id());
  v1::CommitEntry* e = creq.add_entries();
  e->set_block_hash(HashOf(7).ToBytes());
  e->set_slot(u1);
  e->set_checksum(tier_shm::BlockChecksum(Block(u1)));
  e = creq.add_entries();
  e->set_block_hash(HashOf(0).ToBytes());  // the node holds it already
  e->set_slot(u2);
  e->set_checksum(tier_shm::BlockChecksum(Block(u2)));
  v1::CommitResponse cresp;
  grpc::ClientContext cctx;
  ASSERT_TRUE(stub_->Commit(&cctx, creq, &cresp).ok());
  ASSERT_EQ(cresp.results_size(), 2);
  EXPECT_EQ(cresp.results(0), v1::COMMIT_STATUS_STORED);
  EXPECT_EQ(cresp.results(1), v1::COMMIT_STATUS_ALREADY_HELD);
  EXPECT_EQ(Lookup(7, 1), std::vector<v1::Tier>{v1::TIER_DRAM});
  // HashOf(5)'s named reservation stays; nothing unbound is left.
  EXPECT_THAT(registry_.RenderPrometheus(), HasSubstr("pd_tierd_unbound_reserved_blocks 0"));
  EXPECT_THAT(registry_.RenderPrometheus(), HasSubstr("pd_tierd_claimed_blocks 1"));
  EXPECT_THAT(registry_.RenderPrometheus(), HasSubstr("pd_tierd_conflicting_commits_total 0"));

  // Block 0 again with other bytes: the held copy is dropped and the hash refused.
  areq.clear_block_hashes();
  areq.set_unbound_slots(1);
  grpc::ClientContext actx1;
  ASSERT_TRUE(stub_->AllocateSlots(&actx1, areq, &aresp).ok());
  ASSERT_EQ(aresp.grants_size(), 1);
  ASSERT_EQ(aresp.grants(0).status(), v1::SLOT_GRANT_STATUS_GRANTED);
  const uint32_t u3 = aresp.grants(0).slot();
  std::memset(Slot(u3), 0x43, layout_.block_bytes());
  creq.clear_entries();
  e = creq.add_entries();
  e->set_block_hash(HashOf(0).ToBytes());
  e->set_slot(u3);
  e->set_checksum(tier_shm::BlockChecksum(Block(u3)));
  grpc::ClientContext cctx1;
  ASSERT_TRUE(stub_->Commit(&cctx1, creq, &cresp).ok());
  ASSERT_EQ(cresp.results_size(), 1);
  EXPECT_EQ(cresp.results(0), v1::COMMIT_STATUS_REFUSED);
  EXPECT_TRUE(Lookup(0, 1).empty());
  EXPECT_THAT(registry_.RenderPrometheus(), HasSubstr("pd_tierd_conflicting_commits_total 1"));
  EXPECT_THAT(registry_.RenderPrometheus(), HasSubstr("pd_tierd_disputed_blocks 1"));

  areq.clear_block_hashes();
  areq.set_unbound_slots(static_cast<uint32_t>(attach_.num_slots()) + 1);
  grpc::ClientContext actx2;
  grpc::Status s = stub_->AllocateSlots(&actx2, areq, &aresp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("unbound slots requested"));
}

TEST_F(TierdServerTest, ChecksumMismatchIsRefused) {
  StartServer();
  Attach();
  v1::AllocateSlotsRequest areq;
  areq.set_session_id(attach_.session_id());
  areq.set_block_hashes(Bytes({HashOf(7)}));
  v1::AllocateSlotsResponse aresp;
  grpc::ClientContext actx;
  ASSERT_TRUE(stub_->AllocateSlots(&actx, areq, &aresp).ok());
  ASSERT_EQ(aresp.grants(0).status(), v1::SLOT_GRANT_STATUS_GRANTED);
  const uint32_t slot = aresp.grants(0).slot();
  std::memset(Slot(slot), 1, layout_.block_bytes());
  v1::CommitRequest creq;
  creq.set_session_id(attach_.session_id());
  v1::CommitEntry* e = creq.add_entries();
  e->set_block_hash(HashOf(7).ToBytes());
  e->set_slot(slot);
  e->set_checksum(tier_shm::BlockChecksum(Block(slot)) ^ 1);
  v1::CommitResponse cresp;
  grpc::ClientContext cctx;
  ASSERT_TRUE(stub_->Commit(&cctx, creq, &cresp).ok());
  EXPECT_EQ(cresp.results(0), v1::COMMIT_STATUS_CHECKSUM_MISMATCH);
  EXPECT_TRUE(Lookup(7, 1).empty());
}

TEST_F(TierdServerTest, BadArgumentsAndUnknownSessions) {
  StartServer();
  Attach();
  v1::AllocateSlotsRequest areq;
  areq.set_session_id(attach_.session_id());
  areq.set_block_hashes("short");
  v1::AllocateSlotsResponse aresp;
  grpc::ClientContext c1;
  grpc::Status s = stub_->AllocateSlots(&c1, areq, &aresp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("16-byte"));

  areq.set_block_hashes(Bytes({HashOf(1), HashOf(1)}));
  grpc::ClientContext c2;
  s = stub_->AllocateSlots(&c2, areq, &aresp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("listed twice"));

  areq.set_session_id(attach_.session_id() + 1);
  areq.set_block_hashes(Bytes({HashOf(1)}));
  grpc::ClientContext c3;
  s = stub_->AllocateSlots(&c3, areq, &aresp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(s.error_message(), HasSubstr("attach again"));

  // Detach ends the session.
  v1::DetachRequest dreq;
  dreq.set_session_id(attach_.session_id());
  v1::DetachResponse dresp;
  grpc::ClientContext c4;
  EXPECT_TRUE(stub_->Detach(&c4, dreq, &dresp).ok());
  v1::PromoteRequest preq;
  preq.set_session_id(attach_.session_id());
  v1::PromoteResponse presp;
  grpc::ClientContext c5;
  EXPECT_EQ(stub_->Promote(&c5, preq, &presp).error_code(), grpc::StatusCode::FAILED_PRECONDITION);
}

// DRAM (1 MiB) overflows into a real NVMe directory; blocks come back from NVMe with their
// bytes, the index follows every move, and a restarted tierd still has them.
TEST_F(TierdServerTest, SpillToNvmeRestoreAndRestart) {
  config_.nvme_dir = dir_.path() + "/nvme";
  config_.nvme_mib = 8;
  config_.high_watermark = 0.5;
  config_.low_watermark = 0.25;
  config_.maintenance_interval = absl::Hours(1);  // the test runs each pass itself
  StartServer();
  Attach();
  const int n = static_cast<int>(attach_.num_slots());
  // Blocks reach NVMe only when seen twice (admission guard): offer every block twice, each time
  // filling DRAM so that spills run.
  for (int round = 0; round < 2; ++round) {
    for (int first = 0; first < 2 * n; first += 16) {
      Offer(first, 16);
      server_->RunMaintenanceForTest();  // spills DRAM above the high watermark
    }
  }
  v1::TierStats stats;
  grpc::ClientContext sctx;
  ASSERT_TRUE(stub_->Stats(&sctx, v1::StatsRequest(), &stats).ok());
  ASSERT_EQ(stats.tiers_size(), 2);
  ASSERT_GT(stats.tiers(1).used_blocks(), 0u) << stats.DebugString();
  EXPECT_LE(stats.tiers(0).used_blocks(), attach_.num_slots() / 2) << stats.DebugString();

  // Find a block that is on NVMe only and restore it.
  int on_nvme = -1;
  for (int i = 0; i < 2 * n && on_nvme < 0; ++i) {
    const std::vector<v1::Tier> t = Lookup(i, 1);
    if (!t.empty() && t[0] == v1::TIER_NVME) on_nvme = i;
  }
  ASSERT_GE(on_nvme, 0);
  server_->FlushIndexForTest();
  EXPECT_EQ(sink_.Where(HashOf(on_nvme)), "nvme");
  v1::PromoteRequest preq;
  preq.set_session_id(attach_.session_id());
  preq.set_block_hashes(Bytes({HashOf(on_nvme)}));
  v1::PromoteResponse presp;
  grpc::ClientContext pctx;
  ASSERT_TRUE(stub_->Promote(&pctx, preq, &presp).ok());
  ASSERT_EQ(presp.blocks_size(), 1);
  EXPECT_EQ(presp.blocks(0).source_tier(), v1::TIER_NVME);
  EXPECT_EQ(Slot(presp.blocks(0).slot())[0], on_nvme & 0xff);
  EXPECT_EQ(tier_shm::BlockChecksum(Block(presp.blocks(0).slot())), presp.blocks(0).checksum());
  server_->FlushIndexForTest();
  EXPECT_EQ(sink_.Where(HashOf(on_nvme)), "dram");

  // A restarted tierd replays its manifest: NVMe blocks still hit and are announced again.
  std::vector<int> nvme_blocks;
  for (int i = 0; i < 2 * n; ++i) {
    const std::vector<v1::Tier> t = Lookup(i, 1);
    if (!t.empty() && t[0] == v1::TIER_NVME) nvme_blocks.push_back(i);
  }
  ASSERT_FALSE(nvme_blocks.empty());
  region_.reset();
  StopServer();
  RecordingSink fresh;
  auto s = TierdServer::Start(config_, &registry_, &fresh);
  ASSERT_TRUE(s.ok()) << s.status();
  server_ = *std::move(s);
  stub_ = v1::TierService::NewStub(
      grpc::CreateChannel(server_->address(), grpc::InsecureChannelCredentials()));
  for (int i : nvme_blocks) {
    EXPECT_EQ(Lookup(i, 1), std::vector<v1::Tier>{v1::TIER_NVME}) << i;
    EXPECT_EQ(fresh.Where(HashOf(i)), "nvme") << i;
  }
  server_.reset();
}

// The Redis prefix index follows the tiers; a Redis outage changes nothing for the workers and
// the index is repopulated when Redis comes back (it restarts empty).
TEST_F(TierdServerTest, RedisIndexFollowsTheTiersAndIsRepopulated) {
  auto redis = pd::testing::RedisServer::Start({});
  ASSERT_TRUE(redis.ok()) << redis.status();
  redis::RedisConfig rc;
  rc.host = (*redis)->host();
  rc.port = (*redis)->port();
  rc.key_prefix = "pdtest:";
  config_.redis = rc;
  auto s = TierdServer::Start(config_, &registry_);  // no test sink: the real index
  ASSERT_TRUE(s.ok()) << s.status();
  server_ = *std::move(s);
  stub_ = v1::TierService::NewStub(
      grpc::CreateChannel(server_->address(), grpc::InsecureChannelCredentials()));
  Attach();
  ASSERT_EQ(Offer(0, 3), 3);
  auto lookup = [&]() -> std::vector<tier_shm::TierKind> {
    auto client = redis::RedisClient::Connect(rc);
    if (!client.ok()) return {};
    auto tiers = RedisIndex::Lookup(**client, "test-node", {HashOf(0), HashOf(1), HashOf(2)});
    return tiers.ok() ? *tiers : std::vector<tier_shm::TierKind>{};
  };
  auto wait_for = [&](size_t n) {
    const absl::Time deadline = absl::Now() + absl::Seconds(10);
    while (lookup().size() != n && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(20));
    return lookup().size() == n;
  };
  ASSERT_TRUE(wait_for(3)) << (*redis)->LogTail();
  EXPECT_EQ(lookup(), std::vector<tier_shm::TierKind>(3, tier_shm::TierKind::kDram));

  ASSERT_TRUE((*redis)->Stop().ok());
  EXPECT_EQ(Offer(10, 2), 2);  // serving goes on without Redis
  EXPECT_EQ(Lookup(10, 2).size(), 2u);
  ASSERT_TRUE((*redis)->Restart().ok());  // empty
  ASSERT_TRUE(wait_for(3)) << "index not repopulated after the Redis restart";
  v1::TierStats stats;
  grpc::ClientContext ctx;
  ASSERT_TRUE(stub_->Stats(&ctx, v1::StatsRequest(), &stats).ok());
  EXPECT_TRUE(stats.redis_connected());
  EXPECT_THAT(registry_.RenderPrometheus(), HasSubstr("pd_tierd_redis_connected 1"));
  server_.reset();
}

TEST_F(TierdServerTest, StartupErrorsNameTheFlag) {
  TierdConfig bad = config_;
  bad.model = "/nonexistent/model.bin";
  auto s = TierdServer::Start(bad, &registry_);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(std::string(s.status().message()), HasSubstr("--model /nonexistent/model.bin"));

  bad = config_;
  bad.nvme_dir = dir_.path() + "/x";
  bad.nvme_mib = 0;
  s = TierdServer::Start(bad, &registry_);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(std::string(s.status().message()), HasSubstr("--nvme_mib"));

  bad = config_;
  bad.dram_mib = int64_t{1} << 40;
  s = TierdServer::Start(bad, &registry_);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(std::string(s.status().message()), HasSubstr("--dram_mib must be in"));

  bad = config_;
  bad.dram_mib = 999'999'999;  // ~1 PB of slots: more than the pool's slot ids can address
  s = TierdServer::Start(bad, &registry_);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(std::string(s.status().message()), HasSubstr("--dram_mib 999999999"));

  bad = config_;
  bad.low_watermark = 0.95;
  s = TierdServer::Start(bad, &registry_);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace pd::tierd
