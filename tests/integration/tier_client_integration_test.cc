// TierClient against a real TierdServer on loopback: offers land in DRAM, Prepare pins a
// chain whose copies verify, a damaged slot fails verification, and a tierd that goes away and
// comes back is re-attached to without failing anything.
#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "common/testing/temp_dir.h"
#include "common/testing/test_pki.h"
#include "engine/runtime/model_front.h"
#include "engine/runtime/model_runtime.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "services/tier_client/tier_client.h"
#include "services/tierd/tierd_server.h"
#include "services/tierd/tierd_test_util.h"

namespace pd::tier_client {
namespace {

namespace v1 = pdserve::internal::v1;

using tierd::PromotedBlock;
using tierd::SessionId;
using tierd::TierdConfig;
using tierd::TierdServer;

BlockHash ClientHash(int i) {
  std::string bytes(16, '\x11');
  std::memcpy(bytes.data(), &i, sizeof(i));
  return *BlockHash::FromBytes(bytes);
}

class TierClientTest : public ::testing::Test {
 protected:
  void SetUp() override {
    layout_ = tierd::testing::Stories260KLayout();
    config_ = tierd::testing::TestTierdConfig("client-test", 2);
    StartServer();
  }

  void StartServer() {
    auto s = TierdServer::Start(config_, &registry_);
    ASSERT_TRUE(s.ok()) << s.status();
    server_ = *std::move(s);
    config_.grpc_address.port = server_->port();  // a restart reuses the port
  }

  std::unique_ptr<TierClient> StartClient(
      std::function<absl::AnyInvocable<void()>(uint8_t*, size_t)> on_map = nullptr,
      const std::string& node_name = "", int64_t unbound_slots = 0) {
    TierClientConfig c;
    c.unbound_slots = unbound_slots;
    c.on_map = std::move(on_map);
    c.tierd_address = server_->address();
    c.worker_id = "worker-a";
    c.node_name = node_name;
    c.layout = layout_;
    c.reattach_interval = absl::Milliseconds(50);
    auto client = TierClient::Start(c);
    EXPECT_TRUE(client.ok()) << client.status();
    return *std::move(client);
  }

  std::vector<uint8_t> BlockBytes(int i) {
    return std::vector<uint8_t>(layout_.block_bytes(), static_cast<uint8_t>(i * 7 + 1));
  }

  std::shared_ptr<const PromotedRun> PrepareSync(TierClient* client, std::vector<BlockHash> chain) {
    std::shared_ptr<const PromotedRun> out;
    absl::Notification done;
    client->Prepare(
        std::move(chain),
        [&](std::shared_ptr<const PromotedRun> run) {
          out = std::move(run);
          done.Notify();
        },
        /*recompute_seconds_per_block=*/0);
    done.WaitForNotification();
    return out;
  }

  TierdConfig config_;
  v1::KvLayout layout_;
  metrics::Registry registry_;
  std::unique_ptr<TierdServer> server_;
};

TEST_F(TierClientTest, OfferThenPrepareAndCopyOut) {
  std::unique_ptr<TierClient> client = StartClient();
  ASSERT_TRUE(client->WaitAttached(absl::Seconds(10)));
  for (int i = 0; i < 5; ++i) {
    client->Offer(ClientHash(i), BlockBytes(i));
  }
  client->Offer(ClientHash(0), BlockBytes(0));  // evicted twice: offered once more, skipped
  client->FlushOffersForTest();
  EXPECT_EQ(client->Stats().offer_stored_blocks_total, 5u);
  EXPECT_EQ(server_->store()->Lookup({ClientHash(0), ClientHash(1), ClientHash(2)}).size(), 3u);

  // Chain 2, 3, 4, (miss): three pinned blocks that copy out with their bytes.
  std::shared_ptr<const PromotedRun> run =
      PrepareSync(client.get(), {ClientHash(2), ClientHash(3), ClientHash(4), ClientHash(50)});
  ASSERT_NE(run, nullptr);
  ASSERT_EQ(run->size(), 3u);
  std::vector<uint8_t> dst(layout_.block_bytes());
  for (size_t k = 0; k < 3; ++k) {
    ASSERT_TRUE(run->CopyOut(k, dst.data()));
    EXPECT_EQ(dst, BlockBytes(static_cast<int>(k) + 2));
    EXPECT_EQ(run->source(k), tier_shm::TierKind::kDram);
  }
  EXPECT_EQ(server_->store()->Stats().dram.pinned_blocks, 3);
  client->Release(*run);         // sent by the client thread
  client->FlushOffersForTest();  // returns once the release was answered
  EXPECT_EQ(server_->store()->Stats().dram.pinned_blocks, 0);

  // Nothing cached for this chain: nullptr, right away.
  EXPECT_EQ(PrepareSync(client.get(), {ClientHash(77)}), nullptr);
}

// Streams that move to a worker together prepare together: every queued Prepare is sent at
// once and each gets its own run (its blocks, in its chain's order), or nullptr for a miss.
TEST_F(TierClientTest, ManyPreparesAtOnceEachGetTheirOwnRun) {
  std::unique_ptr<TierClient> client = StartClient();
  ASSERT_TRUE(client->WaitAttached(absl::Seconds(10)));
  for (int i = 0; i < 16; ++i) {
    client->Offer(ClientHash(i), BlockBytes(i));
  }
  client->FlushOffersForTest();
  ASSERT_EQ(client->Stats().offer_stored_blocks_total, 16u);
  constexpr int kJobs = 12;
  struct Answer {
    absl::Notification done;
    std::shared_ptr<const PromotedRun> run;
  };
  std::vector<Answer> answers(kJobs);
  for (int j = 0; j < kJobs; ++j) {
    // Job j asks for blocks j, j+1, j+2 (all held for j < 14), the last job for a miss.
    std::vector<BlockHash> chain = {ClientHash(j), ClientHash(j + 1), ClientHash(j + 2)};
    if (j == kJobs - 1) chain = {ClientHash(900)};
    client->Prepare(
        std::move(chain),
        [&answers, j](std::shared_ptr<const PromotedRun> run) {
          answers[j].run = std::move(run);
          answers[j].done.Notify();
        },
        0);
  }
  std::vector<uint8_t> dst(layout_.block_bytes());
  for (int j = 0; j < kJobs; ++j) {
    ASSERT_TRUE(answers[j].done.WaitForNotificationWithTimeout(absl::Seconds(30))) << j;
    if (j == kJobs - 1) {
      EXPECT_EQ(answers[j].run, nullptr);
      continue;
    }
    ASSERT_NE(answers[j].run, nullptr) << j;
    ASSERT_EQ(answers[j].run->size(), 3u) << j;
    for (size_t k = 0; k < 3; ++k) {
      ASSERT_TRUE(answers[j].run->CopyOut(k, dst.data()));
      EXPECT_EQ(dst, BlockBytes(j + static_cast<int>(k))) << j << " " << k;
    }
    client->Release(*answers[j].run);
  }
  client->FlushOffersForTest();
  EXPECT_EQ(server_->store()->Stats().dram.pinned_blocks, 0);
  EXPECT_EQ(client->Stats().prepares_total, static_cast<uint64_t>(kJobs));
}

TEST_F(TierClientTest, AnotherNodesTierdIsFlagged) {
  ASSERT_FALSE(config_.node_name.empty());
  std::unique_ptr<TierClient> same = StartClient(nullptr, config_.node_name);
  ASSERT_TRUE(same->WaitAttached(absl::Seconds(10)));
  EXPECT_FALSE(same->Stats().node_mismatch);
  std::unique_ptr<TierClient> other = StartClient(nullptr, "not-" + config_.node_name);
  ASSERT_TRUE(other->WaitAttached(absl::Seconds(10)));
  EXPECT_TRUE(other->Stats().node_mismatch);  // still attached: its tiers work locally
  std::unique_ptr<TierClient> unchecked = StartClient();
  ASSERT_TRUE(unchecked->WaitAttached(absl::Seconds(10)));
  EXPECT_FALSE(unchecked->Stats().node_mismatch);
}

// With unbound slots reserved ahead, an offer's bytes go straight into tierd's shared memory and
// the block is named at Commit: stored, skipped when the node has it, dropped when the fill
// fails (the slot goes back to tierd), and restored byte for byte.
TEST_F(TierClientTest, InPlaceOffersCopyOnceIntoReservedSlots) {
  std::unique_ptr<TierClient> client = StartClient(nullptr, "", /*unbound_slots=*/4);
  ASSERT_TRUE(client->WaitAttached(absl::Seconds(10)));
  // The client thread reserves the 4 slots (tierd grants them before the client has them).
  EXPECT_TRUE(client->AwaitStatsForTest(
      [](const TierLinkStats& st) { return st.unbound_slots_held >= 4; }, absl::Seconds(10)));
  ASSERT_EQ(client->Stats().unbound_slots_held, 4);
  EXPECT_EQ(server_->store()->dram()->Stats().unbound_blocks, 4);
  int fills = 0;
  for (int i = 0; i < 3; ++i) {
    client->Offer(ClientHash(i), [&](uint8_t* dst) {
      ++fills;
      std::vector<uint8_t> b = BlockBytes(i);
      std::memcpy(dst, b.data(), b.size());
      return true;
    });
  }
  client->FlushOffersForTest();
  EXPECT_EQ(fills, 3);
  TierLinkStats st = client->Stats();
  EXPECT_EQ(st.offered_in_place_blocks_total, 3u);
  EXPECT_EQ(st.offer_stored_blocks_total, 3u);
  // Held already: the copy is made (it had to be, before the block was reused) but not kept.
  client->Offer(ClientHash(1), BlockBytes(1));
  // A block that cannot be read: nothing offered, the slot released.
  client->Offer(ClientHash(9), [](uint8_t*) { return false; });
  client->FlushOffersForTest();
  st = client->Stats();
  EXPECT_EQ(st.offer_skipped_blocks_total, 1u);
  EXPECT_GE(st.offer_dropped_blocks_total, 1u);
  EXPECT_FALSE(server_->store()->dram()->Contains(ClientHash(9)));
  std::shared_ptr<const PromotedRun> run =
      PrepareSync(client.get(), {ClientHash(0), ClientHash(1), ClientHash(2)});
  ASSERT_NE(run, nullptr);
  ASSERT_EQ(run->size(), 3u);
  std::vector<uint8_t> dst(layout_.block_bytes());
  for (size_t k = 0; k < 3; ++k) {
    ASSERT_TRUE(run->CopyOut(k, dst.data()));
    EXPECT_EQ(dst, BlockBytes(static_cast<int>(k)));
  }
  client->Release(*run);
}

// A tierd restart ends the session's reservations: the client reserves again in the new
// session and in-place offers keep working.
TEST_F(TierClientTest, InPlaceOffersSurviveATierdRestart) {
  std::unique_ptr<TierClient> client = StartClient(nullptr, "", /*unbound_slots=*/2);
  ASSERT_TRUE(client->WaitAttached(absl::Seconds(10)));
  client->Offer(ClientHash(1), BlockBytes(1));
  client->FlushOffersForTest();
  server_.reset();
  StartServer();
  const uint64_t attaches = client->Stats().attaches_total;
  const auto reattached = [attaches](const TierLinkStats& st) {
    return st.attaches_total > attaches;
  };
  // Each offer's failed call detects the restart (or the offer is dropped); no sleeping.
  for (int i = 0; i < 100 && !client->AwaitStatsForTest(reattached, absl::Milliseconds(100)); ++i) {
    client->Offer(ClientHash(100 + i), BlockBytes(3));
    client->FlushOffersForTest();
  }
  ASSERT_TRUE(client->WaitAttached(absl::Seconds(10)));
  EXPECT_TRUE(client->AwaitStatsForTest(
      [](const TierLinkStats& st) { return st.unbound_slots_held >= 2; }, absl::Seconds(10)));
  ASSERT_EQ(client->Stats().unbound_slots_held, 2);
  const uint64_t in_place = client->Stats().offered_in_place_blocks_total;
  client->Offer(ClientHash(7), BlockBytes(7));
  client->FlushOffersForTest();
  EXPECT_EQ(client->Stats().offered_in_place_blocks_total, in_place + 1);
  EXPECT_TRUE(server_->store()->dram()->Contains(ClientHash(7)));
}

TEST_F(TierClientTest, DamagedSlotFailsVerification) {
  std::unique_ptr<TierClient> client = StartClient();
  ASSERT_TRUE(client->WaitAttached(absl::Seconds(10)));
  client->Offer(ClientHash(1), BlockBytes(1));
  client->FlushOffersForTest();
  std::shared_ptr<const PromotedRun> run = PrepareSync(client.get(), {ClientHash(1)});
  ASSERT_NE(run, nullptr);
  // Someone writes into the slot after the pin (a stray worker write, an expired lease).
  const std::vector<PromotedBlock> pinned =
      server_->store()->Promote(SessionId(12345), {ClientHash(1)});
  ASSERT_EQ(pinned.size(), 1u);
  server_->store()->dram()->SlotData(pinned[0].slot)[100] ^= 0xff;
  std::vector<uint8_t> dst(layout_.block_bytes());
  EXPECT_FALSE(run->CopyOut(0, dst.data()));
  EXPECT_EQ(client->Stats().checksum_failures_total, 1u);
}

// The device-pool restore path: BlockBytes points into the mapping handed to on_map, Verify
// checks the shm bytes in place, and on_map's cleanup runs once, when the last user of the
// mapping (client or run) lets go.
TEST_F(TierClientTest, OnMapHookAndInPlaceVerification) {
  struct Mapping {
    uint8_t* data = nullptr;
    size_t size_bytes = 0;
    int maps = 0;
    int unmaps = 0;
  };
  auto seen = std::make_shared<Mapping>();
  std::unique_ptr<TierClient> client =
      StartClient([seen](uint8_t* data, size_t size_bytes) -> absl::AnyInvocable<void()> {
        seen->data = data;
        seen->size_bytes = size_bytes;
        ++seen->maps;
        return [seen] { ++seen->unmaps; };
      });
  ASSERT_TRUE(client->WaitAttached(absl::Seconds(10)));
  EXPECT_EQ(seen->maps, 1);
  client->Offer(ClientHash(1), BlockBytes(1));
  client->Offer(ClientHash(2), BlockBytes(2));
  client->FlushOffersForTest();
  std::shared_ptr<const PromotedRun> run =
      PrepareSync(client.get(), {ClientHash(1), ClientHash(2)});
  ASSERT_NE(run, nullptr);
  ASSERT_EQ(run->size(), 2u);
  EXPECT_EQ(run->block_bytes(), layout_.block_bytes());
  for (size_t k = 0; k < 2; ++k) {
    const uint8_t* bytes = run->BlockBytes(k);
    ASSERT_GE(bytes, seen->data);
    ASSERT_LE(bytes + run->block_bytes(), seen->data + seen->size_bytes);
    EXPECT_EQ(std::vector<uint8_t>(bytes, bytes + run->block_bytes()),
              BlockBytes(static_cast<int>(k) + 1));
    EXPECT_TRUE(run->Verify(k));
  }
  const std::vector<PromotedBlock> pinned =
      server_->store()->Promote(SessionId(12345), {ClientHash(2)});
  ASSERT_EQ(pinned.size(), 1u);
  server_->store()->dram()->SlotData(pinned[0].slot)[7] ^= 0xff;
  EXPECT_FALSE(run->Verify(1));
  EXPECT_EQ(client->Stats().checksum_failures_total, 1u);
  client->Release(*run);
  client.reset();
  EXPECT_EQ(seen->unmaps, 0);  // the run still reads the mapping
  run.reset();
  EXPECT_EQ(seen->unmaps, 1);
}

TEST_F(TierClientTest, TierdDownThenBack) {
  std::unique_ptr<TierClient> client = StartClient();
  ASSERT_TRUE(client->WaitAttached(absl::Seconds(10)));
  server_.reset();  // tierd gone
  // Calls never fail or hang: the first one notices, every later one answers nullptr.
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(PrepareSync(client.get(), {ClientHash(1)}), nullptr);
  }
  client->Offer(ClientHash(2), BlockBytes(2));
  EXPECT_FALSE(client->Stats().attached);
  StartServer();  // same port, new sessions, empty pool
  ASSERT_TRUE(client->WaitAttached(absl::Seconds(10)));
  client->Offer(ClientHash(3), BlockBytes(3));
  client->FlushOffersForTest();
  std::shared_ptr<const PromotedRun> run = PrepareSync(client.get(), {ClientHash(3)});
  ASSERT_NE(run, nullptr);
  EXPECT_EQ(run->size(), 1u);
  EXPECT_GE(client->Stats().attaches_total, 2u);
}

// With TLS (mutual) and a cluster token, only a client with both gets in.
TEST_F(TierClientTest, TlsAndClusterTokenGuardEveryCall) {
  server_.reset();
  auto dir = pd::testing::TempDir::Create("pd-tier-tls-");
  ASSERT_TRUE(dir.ok());
  auto pki = pd::testing::MakeTestPki(dir->path());
  ASSERT_TRUE(pki.ok()) << pki.status();
  const std::string token = "0123456789abcdef0123456789abcdef";
  const std::string token_file = dir->File("token");
  {
    std::FILE* f = std::fopen(token_file.c_str(), "w");
    ASSERT_NE(f, nullptr);
    std::fputs(token.c_str(), f);
    std::fclose(f);
  }
  config_.tls = {pki->server_cert, pki->server_key, pki->ca_cert};
  config_.cluster_token_file = token_file;
  config_.grpc_address.port = 0;
  StartServer();

  auto connect = [&](std::vector<services::CallHeader> headers) {
    auto security = services::ClientSecurity::Create(
        {pki->ca_cert, pki->client_cert, pki->client_key}, std::move(headers));
    EXPECT_TRUE(security.ok()) << security.status();
    return *security;
  };
  // TLS and the token: attaches and works.
  TierClientConfig c;
  c.tierd_address = server_->address();
  c.worker_id = "worker-secure";
  c.layout = layout_;
  c.security = connect({services::ClusterTokenHeader(token)});
  auto client = TierClient::Start(c);
  ASSERT_TRUE(client.ok());
  ASSERT_TRUE((*client)->WaitAttached(absl::Seconds(10)));
  (*client)->Offer(ClientHash(5), BlockBytes(5));
  (*client)->FlushOffersForTest();
  EXPECT_EQ((*client)->Stats().offer_stored_blocks_total, 1u);

  // TLS without the token: UNAUTHENTICATED on every call.
  auto no_token = v1::TierService::NewStub(
      connect({})->CreateChannel(server_->address(), grpc::ChannelArguments()));
  v1::LookupRequest req;
  v1::LookupResponse resp;
  grpc::ClientContext ctx1;
  ctx1.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  grpc::Status s = no_token->Lookup(&ctx1, req, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED) << s.error_message();
  EXPECT_THAT(s.error_message(), ::testing::HasSubstr("cluster token"));

  // Plaintext: no connection at all.
  auto plain = v1::TierService::NewStub(
      grpc::CreateChannel(server_->address(), grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx2;
  ctx2.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(2)));
  EXPECT_FALSE(plain->Lookup(&ctx2, req, &resp).ok());
  client->reset();
}

}  // namespace
}  // namespace pd::tier_client
