// RedisIndex against a real redis-server child per test (pd::testing::RedisServer).
#include <signal.h>
#include <sys/types.h>

#include <algorithm>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/redis/prefix_index.h"
#include "common/testing/redis_server.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "services/tierd/redis_index.h"

namespace pd::tierd {
namespace {

using ::pd::testing::RedisServer;
using redis::RedisClient;
using redis::RedisConfig;
using redis::RedisReply;
using ::testing::ElementsAre;
using ::testing::IsEmpty;
using ::testing::UnorderedElementsAreArray;

using Snapshot = std::vector<std::pair<BlockHash, tier_shm::TierKind>>;

BlockHash H(uint64_t n) { return BlockHash{0xfeedULL, n}; }

// What the test's "TierStore" holds; the index's snapshot function reads it. Put and Remove
// change it, then tell the index, as tierd does (RedisIndex's ordering contract).
class FakeHoldings {
 public:
  void Set(const Snapshot& entries) {
    absl::MutexLock lock(&mu_);
    entries_.clear();
    for (const auto& [hash, tier] : entries) {
      entries_[hash] = tier;
    }
  }
  void Put(RedisIndex& index, const BlockHash& hash, tier_shm::TierKind tier) {
    {
      absl::MutexLock lock(&mu_);
      entries_[hash] = tier;
    }
    index.Publish(hash, tier);
  }
  void Remove(RedisIndex& index, const BlockHash& hash) {
    {
      absl::MutexLock lock(&mu_);
      entries_.erase(hash);
    }
    index.Unpublish(hash);
  }
  RedisIndex::SnapshotFn Fn() {
    return [this] {
      absl::MutexLock lock(&mu_);
      return Snapshot(entries_.begin(), entries_.end());
    };
  }

 private:
  absl::Mutex mu_;
  std::map<BlockHash, tier_shm::TierKind> entries_ ABSL_GUARDED_BY(mu_);
};

// Polls `condition` every 10 ms until it holds or `timeout` passes; returns whether it held.
bool PollUntil(const std::function<bool()>& condition, absl::Duration timeout = absl::Seconds(20)) {
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    if (condition()) {
      return true;
    }
    absl::SleepFor(absl::Milliseconds(10));
  }
  return condition();
}

class RedisIndexIntegrationTest : public ::testing::Test {
 protected:
  void StartServer(RedisServer::Options options = {}) {
    auto server = RedisServer::Start(std::move(options));
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
  }

  RedisConfig Redis(absl::string_view prefix = "pd:test:") const {
    RedisConfig config;
    config.port = server_->port();
    config.password = server_->password();
    config.key_prefix = std::string(prefix);
    config.connect_timeout = absl::Milliseconds(300);
    config.command_timeout = absl::Milliseconds(1000);
    config.reconnect_backoff_initial = absl::Milliseconds(10);
    config.reconnect_backoff_max = absl::Milliseconds(40);
    config.max_reconnect_attempts = 1;
    return config;
  }

  static RedisIndexConfig Index(absl::string_view node) {
    RedisIndexConfig config;
    config.node = std::string(node);
    config.flush_interval = absl::Milliseconds(5);
    config.retry_interval = absl::Milliseconds(50);
    return config;
  }

  std::unique_ptr<RedisIndex> CreateIndex(const RedisConfig& redis, const RedisIndexConfig& config,
                                          FakeHoldings& holdings) {
    auto index = RedisIndex::Create(redis, config, holdings.Fn());
    EXPECT_TRUE(index.ok()) << index.status();
    return index.ok() ? *std::move(index) : nullptr;
  }

  std::unique_ptr<RedisClient> Client(const RedisConfig& config) {
    auto client = RedisClient::Connect(config);
    EXPECT_TRUE(client.ok()) << client.status();
    return client.ok() ? *std::move(client) : nullptr;
  }

  // Sorted members of a set (empty when the key is missing).
  static std::vector<std::string> Members(RedisClient& client, const std::string& key) {
    auto reply = client.Command({"SMEMBERS", key});
    EXPECT_TRUE(reply.ok()) << reply.status();
    std::vector<std::string> out;
    if (reply.ok()) {
      for (const RedisReply& r : reply->elements) {
        out.push_back(r.str);
      }
    }
    std::sort(out.begin(), out.end());
    return out;
  }

  static int64_t Ttl(RedisClient& client, const std::string& key) {
    auto reply = client.Command({"TTL", key});
    EXPECT_TRUE(reply.ok()) << reply.status();
    return reply.ok() ? reply->integer : -100;
  }

  // Lookup of `chain` on `node`; empty on error.
  static std::vector<tier_shm::TierKind> LookupOrEmpty(RedisClient& client, absl::string_view node,
                                                       const std::vector<BlockHash>& chain) {
    auto tiers = RedisIndex::Lookup(client, node, chain);
    return tiers.ok() ? *tiers : std::vector<tier_shm::TierKind>();
  }

  // SIGKILLs the server (its pid from INFO server), so it gets no chance to close connections.
  void KillServer() {
    auto client = Client(Redis());
    ASSERT_NE(client, nullptr);
    auto info = client->Command({"INFO", "server"});
    ASSERT_TRUE(info.ok()) << info.status();
    pid_t pid = 0;
    for (absl::string_view line : absl::StrSplit(info->str, "\r\n")) {
      if (absl::ConsumePrefix(&line, "process_id:")) {
        int value = 0;
        ASSERT_TRUE(absl::SimpleAtoi(line, &value)) << line;
        pid = value;
      }
    }
    ASSERT_GT(pid, 0) << info->str;
    ASSERT_EQ(kill(pid, SIGKILL), 0);
    ASSERT_TRUE(server_->Stop().ok());  // reaps it
  }

  std::unique_ptr<RedisServer> server_;
};

TEST_F(RedisIndexIntegrationTest, PublishUnpublishAndLookupStopsAtFirstMiss) {
  StartServer();
  FakeHoldings holdings;
  auto index = CreateIndex(Redis(), Index("n1"), holdings);
  auto client = Client(Redis());
  ASSERT_NE(index, nullptr);
  ASSERT_NE(client, nullptr);

  holdings.Put(*index, H(0), tier_shm::TierKind::kDram);
  holdings.Put(*index, H(1), tier_shm::TierKind::kNvme);
  holdings.Put(*index, H(3), tier_shm::TierKind::kDram);  // after the gap at H(2)
  ASSERT_TRUE(index->Flush().ok());

  const std::vector<BlockHash> chain = {H(0), H(1), H(2), H(3)};
  EXPECT_THAT(LookupOrEmpty(*client, "n1", chain),
              ElementsAre(tier_shm::TierKind::kDram, tier_shm::TierKind::kNvme));
  for (int64_t batch : {1, 2, 3}) {
    auto tiers = RedisIndex::Lookup(*client, "n1", chain, batch);
    ASSERT_TRUE(tiers.ok()) << tiers.status();
    EXPECT_THAT(*tiers, ElementsAre(tier_shm::TierKind::kDram, tier_shm::TierKind::kNvme))
        << "batch " << batch;
  }
  EXPECT_THAT(LookupOrEmpty(*client, "n2", chain), IsEmpty());  // another node holds nothing
  EXPECT_THAT(LookupOrEmpty(*client, "n1", {}), IsEmpty());
  EXPECT_EQ(RedisIndex::Lookup(*client, "bad:node", chain).status().code(),
            absl::StatusCode::kInvalidArgument);

  // Membership and the node list.
  EXPECT_THAT(Members(*client, client->Key("node:n1:blocks")),
              UnorderedElementsAreArray({H(0).ToHex(), H(1).ToHex(), H(3).ToHex()}));
  EXPECT_THAT(Members(*client, client->Key("nodes")), ElementsAre("n1"));

  // The block moves DRAM -> NVMe, then H(1) leaves: the chain now stops after H(0).
  holdings.Put(*index, H(0), tier_shm::TierKind::kNvme);
  holdings.Remove(*index, H(1));
  ASSERT_TRUE(index->Flush().ok());
  EXPECT_THAT(LookupOrEmpty(*client, "n1", chain), ElementsAre(tier_shm::TierKind::kNvme));
  EXPECT_THAT(Members(*client, client->Key("node:n1:blocks")),
              UnorderedElementsAreArray({H(0).ToHex(), H(3).ToHex()}));

  const RedisIndexStats stats = index->Stats();
  EXPECT_TRUE(stats.connected);
  EXPECT_EQ(stats.pending, 0);
  // The initial resync may have run before or after the first updates: >=.
  EXPECT_GE(stats.published_total, 4u);
  EXPECT_GE(stats.unpublished_total, 1u);
  EXPECT_GE(stats.resyncs_total, 1u);
  EXPECT_GE(stats.batches_total, 2u);
  EXPECT_EQ(stats.dropped_total, 0u);
}

// The router's read: several (node, chain) questions in one pipelined round trip.
TEST_F(RedisIndexIntegrationTest, BatchLookupAnswersEveryQuestionInOneCall) {
  StartServer();
  FakeHoldings n1, n2;
  n1.Set({{H(0), tier_shm::TierKind::kDram},
          {H(1), tier_shm::TierKind::kNvme},
          {H(3), tier_shm::TierKind::kNvme}});
  n2.Set({{H(1), tier_shm::TierKind::kDram}, {H(2), tier_shm::TierKind::kDram}});
  auto a = CreateIndex(Redis(), Index("n1"), n1);
  auto b = CreateIndex(Redis(), Index("n2"), n2);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  ASSERT_TRUE(a->Flush().ok());
  ASSERT_TRUE(b->Flush().ok());
  auto client = Client(Redis());
  ASSERT_NE(client, nullptr);

  const std::vector<BlockHash> chain = {H(0), H(1), H(2), H(3)};
  const absl::Span<const BlockHash> all(chain);
  const std::vector<redis::PrefixQuery> queries = {{"n1", all}, {"n1", all.subspan(3)},
                                                   {"n2", all}, {"n2", all.subspan(1)},
                                                   {"n3", all}, {"n2", all.subspan(4)}};
  const uint64_t calls_before = client->Stats().num_calls;
  auto tiers = redis::LookupPrefixTiersBatch(*client, queries);
  ASSERT_TRUE(tiers.ok()) << tiers.status();
  EXPECT_EQ(client->Stats().num_calls, calls_before + 1);
  using redis::PrefixTier;
  EXPECT_THAT(*tiers,
              ElementsAre(ElementsAre(PrefixTier::kDram, PrefixTier::kNvme),
                          ElementsAre(PrefixTier::kNvme), IsEmpty(),
                          ElementsAre(PrefixTier::kDram, PrefixTier::kDram), IsEmpty(), IsEmpty()));

  const std::vector<redis::PrefixQuery> bad = {{"n1", all}, {"a:b", all}};
  EXPECT_EQ(redis::LookupPrefixTiersBatch(*client, bad).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(RedisIndexIntegrationTest, BackgroundThreadFlushesWithoutFlushCalls) {
  StartServer();
  FakeHoldings holdings;
  auto index = CreateIndex(Redis(), Index("n1"), holdings);
  auto client = Client(Redis());
  ASSERT_NE(index, nullptr);
  ASSERT_NE(client, nullptr);
  holdings.Put(*index, H(7), tier_shm::TierKind::kNvme);
  EXPECT_TRUE(PollUntil([&] { return LookupOrEmpty(*client, "n1", {H(7)}).size() == 1; }));
}

TEST_F(RedisIndexIntegrationTest, EntriesAndMembershipHaveTtls) {
  StartServer();
  FakeHoldings holdings;
  holdings.Set({{H(1), tier_shm::TierKind::kDram}});
  RedisIndexConfig config = Index("n1");
  config.entry_ttl = absl::Seconds(90);
  auto index = CreateIndex(Redis(), config, holdings);
  auto client = Client(Redis());
  ASSERT_NE(index, nullptr);
  ASSERT_NE(client, nullptr);
  holdings.Put(*index, H(2), tier_shm::TierKind::kNvme);
  ASSERT_TRUE(index->Flush().ok());

  for (const BlockHash& h : {H(1), H(2)}) {
    const int64_t ttl = Ttl(*client, client->Key(redis::PrefixBlockKey("n1", h)));
    EXPECT_GT(ttl, 0);
    EXPECT_LE(ttl, 90);
  }
  const int64_t set_ttl = Ttl(*client, client->Key(redis::PrefixNodeBlocksKey("n1")));
  EXPECT_GT(set_ttl, 0);
  EXPECT_LE(set_ttl, 90);
  EXPECT_EQ(Ttl(*client, client->Key("nodes")), -1);  // the node list does not expire
}

TEST_F(RedisIndexIntegrationTest, AuthAndKeyPrefixesIsolateClusters) {
  StartServer({.password = "s3cret pass"});
  FakeHoldings holdings_a, holdings_b;
  holdings_a.Set({{H(1), tier_shm::TierKind::kDram}});
  holdings_b.Set({{H(2), tier_shm::TierKind::kNvme}});
  auto a = CreateIndex(Redis("pd:a:"), Index("n1"), holdings_a);
  auto b = CreateIndex(Redis("pd:b:"), Index("n1"), holdings_b);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  ASSERT_TRUE(a->Flush().ok());
  ASSERT_TRUE(b->Flush().ok());

  auto client_a = Client(Redis("pd:a:"));
  auto client_b = Client(Redis("pd:b:"));
  ASSERT_NE(client_a, nullptr);
  ASSERT_NE(client_b, nullptr);
  const std::vector<BlockHash> chain_1 = {H(1)}, chain_2 = {H(2)};
  EXPECT_THAT(LookupOrEmpty(*client_a, "n1", chain_1), ElementsAre(tier_shm::TierKind::kDram));
  EXPECT_THAT(LookupOrEmpty(*client_a, "n1", chain_2), IsEmpty());
  EXPECT_THAT(LookupOrEmpty(*client_b, "n1", chain_2), ElementsAre(tier_shm::TierKind::kNvme));
  EXPECT_THAT(LookupOrEmpty(*client_b, "n1", chain_1), IsEmpty());
  // Each cluster's resync only touched its own set.
  EXPECT_THAT(Members(*client_a, client_a->Key("node:n1:blocks")), ElementsAre(H(1).ToHex()));
  EXPECT_THAT(Members(*client_b, client_b->Key("node:n1:blocks")), ElementsAre(H(2).ToHex()));

  // A wrong password: Create still succeeds (tierd serves without Redis), Flush says why.
  RedisConfig wrong = Redis("pd:a:");
  wrong.password = "nope";
  FakeHoldings empty;
  auto bad = CreateIndex(wrong, Index("n9"), empty);
  ASSERT_NE(bad, nullptr);
  empty.Put(*bad, H(3), tier_shm::TierKind::kDram);
  EXPECT_EQ(bad->Flush().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_FALSE(bad->Stats().connected);
  EXPECT_EQ(bad->Stats().pending, 1);
}

// issue #6 acceptance: Redis killed -> updates keep being queued, stats say disconnected; Redis
// back (empty) on the same port -> the index is repopulated from the snapshot.
TEST_F(RedisIndexIntegrationTest, RepopulatesFromSnapshotAfterRedisRestart) {
  StartServer();
  FakeHoldings holdings;
  holdings.Set({{H(1), tier_shm::TierKind::kDram}, {H(2), tier_shm::TierKind::kNvme}});
  auto index = CreateIndex(Redis(), Index("n1"), holdings);
  ASSERT_NE(index, nullptr);
  ASSERT_TRUE(index->Flush().ok());
  ASSERT_TRUE(index->Stats().connected);
  const uint64_t resyncs_before = index->Stats().resyncs_total;

  KillServer();
  // The node keeps changing while Redis is away: H(3) arrives (held and queued).
  holdings.Put(*index, H(3), tier_shm::TierKind::kDram);
  EXPECT_FALSE(index->Flush().ok());
  EXPECT_TRUE(PollUntil([&] { return !index->Stats().connected; }));
  index->Publish(H(4), tier_shm::TierKind::kDram);  // queued, never held: the snapshot must win
  EXPECT_GE(index->Stats().pending, 1);
  EXPECT_GE(index->Stats().errors_total, 1u);

  ASSERT_TRUE(server_->Restart().ok()) << server_->LogTail();
  auto client = Client(Redis());
  ASSERT_NE(client, nullptr);
  const std::vector<BlockHash> chain = {H(1), H(2), H(3)};
  // No Flush: the background thread reconnects and resyncs by itself.
  EXPECT_TRUE(PollUntil([&] { return LookupOrEmpty(*client, "n1", chain).size() == 3; }))
      << "stats: connected=" << index->Stats().connected
      << " errors=" << index->Stats().errors_total;
  EXPECT_THAT(
      LookupOrEmpty(*client, "n1", chain),
      ElementsAre(tier_shm::TierKind::kDram, tier_shm::TierKind::kNvme, tier_shm::TierKind::kDram));
  EXPECT_TRUE(PollUntil([&] { return index->Stats().connected; }));
  EXPECT_GT(index->Stats().resyncs_total, resyncs_before);
  // H(4) was queued before the resync's snapshot and is not held, so the snapshot superseded it.
  EXPECT_THAT(Members(*client, client->Key("node:n1:blocks")),
              UnorderedElementsAreArray({H(1).ToHex(), H(2).ToHex(), H(3).ToHex()}));
  EXPECT_THAT(Members(*client, client->Key("nodes")), ElementsAre("n1"));
}

// Redis restarted (empty) while the node had nothing to update: the idle probe notices and the
// resync repopulates it.
TEST_F(RedisIndexIntegrationTest, RepopulatesAfterRestartWithoutAnyUpdates) {
  StartServer();
  FakeHoldings holdings;
  holdings.Set({{H(1), tier_shm::TierKind::kNvme}, {H(2), tier_shm::TierKind::kDram}});
  auto index = CreateIndex(Redis(), Index("n1"), holdings);
  ASSERT_NE(index, nullptr);
  ASSERT_TRUE(index->Flush().ok());
  ASSERT_TRUE(server_->Restart().ok()) << server_->LogTail();
  auto client = Client(Redis());
  ASSERT_NE(client, nullptr);
  EXPECT_TRUE(PollUntil([&] {
    return LookupOrEmpty(*client, "n1", {H(1), H(2)}).size() == 2;
  })) << "resyncs="
      << index->Stats().resyncs_total << " errors=" << index->Stats().errors_total;
}

// A restarted tierd (new RedisIndex, same node) holding fewer blocks removes its stale entries
// and leaves other nodes alone.
TEST_F(RedisIndexIntegrationTest, ResyncRemovesStaleEntriesOfItsOwnNodeOnly) {
  StartServer();
  FakeHoldings n1, n2;
  Snapshot many;
  for (uint64_t i = 0; i < 50; ++i) {
    many.emplace_back(H(i), i % 2 == 0 ? tier_shm::TierKind::kDram : tier_shm::TierKind::kNvme);
  }
  n1.Set(many);
  n2.Set(many);
  RedisIndexConfig config = Index("n1");
  config.max_batch = 7;  // several batches per resync step
  {
    auto first = CreateIndex(Redis(), config, n1);
    auto other = CreateIndex(Redis(), Index("n2"), n2);
    ASSERT_NE(first, nullptr);
    ASSERT_NE(other, nullptr);
    ASSERT_TRUE(first->Flush().ok());
    ASSERT_TRUE(other->Flush().ok());
  }
  auto client = Client(Redis());
  ASSERT_NE(client, nullptr);
  std::vector<BlockHash> chain;
  for (uint64_t i = 0; i < 50; ++i) {
    chain.push_back(H(i));
  }
  ASSERT_EQ(LookupOrEmpty(*client, "n1", chain).size(), 50u);

  n1.Set({{H(0), tier_shm::TierKind::kNvme},
          {H(1), tier_shm::TierKind::kNvme},
          {H(40), tier_shm::TierKind::kDram}});
  auto restarted = CreateIndex(Redis(), config, n1);
  ASSERT_NE(restarted, nullptr);
  ASSERT_TRUE(restarted->Flush().ok());
  EXPECT_THAT(LookupOrEmpty(*client, "n1", chain),
              ElementsAre(tier_shm::TierKind::kNvme, tier_shm::TierKind::kNvme));
  EXPECT_THAT(LookupOrEmpty(*client, "n1", {H(40)}), ElementsAre(tier_shm::TierKind::kDram));
  EXPECT_THAT(Members(*client, client->Key("node:n1:blocks")),
              UnorderedElementsAreArray({H(0).ToHex(), H(1).ToHex(), H(40).ToHex()}));
  auto exists = client->Command({"EXISTS", client->Key(redis::PrefixBlockKey("n1", H(2)))});
  ASSERT_TRUE(exists.ok());
  EXPECT_EQ(exists->integer, 0);
  EXPECT_GE(restarted->Stats().unpublished_total, 47u);
  EXPECT_EQ(LookupOrEmpty(*client, "n2", chain).size(), 50u);  // untouched
}

// Updates beyond max_pending are dropped and counted; the resync that follows restores them.
TEST_F(RedisIndexIntegrationTest, DroppedUpdatesAreRecoveredByResync) {
  StartServer();
  FakeHoldings holdings;
  RedisIndexConfig config = Index("n1");
  config.max_pending = 4;
  config.flush_interval = absl::Hours(1);  // only Flush sends
  auto index = CreateIndex(Redis(), config, holdings);
  auto client = Client(Redis());
  ASSERT_NE(index, nullptr);
  ASSERT_NE(client, nullptr);
  ASSERT_TRUE(index->Flush().ok());
  const uint64_t resyncs = index->Stats().resyncs_total;

  std::vector<BlockHash> chain;
  for (uint64_t i = 0; i < 10; ++i) {
    holdings.Put(*index, H(i), tier_shm::TierKind::kDram);
    chain.push_back(H(i));
  }
  EXPECT_EQ(index->Stats().dropped_total, 6u);
  EXPECT_EQ(index->Stats().pending, 4);
  ASSERT_TRUE(index->Flush().ok());
  EXPECT_EQ(index->Stats().resyncs_total, resyncs + 1);
  EXPECT_EQ(LookupOrEmpty(*client, "n1", chain).size(), 10u);
}

TEST_F(RedisIndexIntegrationTest, RemoveNodeDeletesEverythingOfThatNode) {
  StartServer();
  FakeHoldings n1, n2;
  n1.Set({{H(1), tier_shm::TierKind::kDram}, {H(2), tier_shm::TierKind::kNvme}});
  n2.Set({{H(1), tier_shm::TierKind::kNvme}});
  RedisIndexConfig config1 = Index("n1"), config2 = Index("n2");
  config1.flush_interval = config2.flush_interval = absl::Hours(1);
  {
    auto a = CreateIndex(Redis(), config1, n1);
    auto b = CreateIndex(Redis(), config2, n2);
    ASSERT_NE(a, nullptr);
    ASSERT_NE(b, nullptr);
    ASSERT_TRUE(a->Flush().ok());
    ASSERT_TRUE(b->Flush().ok());
  }
  auto client = Client(Redis());
  ASSERT_NE(client, nullptr);
  EXPECT_THAT(Members(*client, client->Key("nodes")), ElementsAre("n1", "n2"));
  // Peer addresses (remote restore) go with the node too.
  ASSERT_TRUE(client->Command({"SET", client->Key("peer:n1"), "10.0.0.1:50071"}).ok());
  ASSERT_TRUE(client->Command({"SET", client->Key("peer:n2"), "10.0.0.2:50071"}).ok());
  auto peers = redis::LookupPeerAddresses(*client, {"n1", "n2", "n3"});
  ASSERT_TRUE(peers.ok()) << peers.status();
  EXPECT_THAT(*peers, ElementsAre("10.0.0.1:50071", "10.0.0.2:50071", ""));

  ASSERT_TRUE(RedisIndex::RemoveNode(*client, "n1", /*batch=*/1).ok());
  peers = redis::LookupPeerAddresses(*client, {"n1", "n2"});
  ASSERT_TRUE(peers.ok()) << peers.status();
  EXPECT_THAT(*peers, ElementsAre("", "10.0.0.2:50071"));
  EXPECT_THAT(LookupOrEmpty(*client, "n1", {H(1), H(2)}), IsEmpty());
  EXPECT_THAT(Members(*client, client->Key("node:n1:blocks")), IsEmpty());
  EXPECT_THAT(Members(*client, client->Key("nodes")), ElementsAre("n2"));
  EXPECT_THAT(LookupOrEmpty(*client, "n2", {H(1)}), ElementsAre(tier_shm::TierKind::kNvme));
  auto keys = client->Command({"KEYS", client->Key("blk:n1:*")});
  ASSERT_TRUE(keys.ok());
  EXPECT_THAT(keys->elements, IsEmpty());
  // Removing an unknown node is a no-op.
  EXPECT_TRUE(RedisIndex::RemoveNode(*client, "n7").ok());
}

// docs/redis_index.md's ACL recipe, read from the page, on a real redis-server: a user limited
// to the default prefix's keys and the listed commands runs everything tierd and the router do
// (publish, resync, lookups, peer announcement and lookup, node listing, RemoveNode) without a
// NOPERM, and cannot touch a key outside the prefix.
TEST_F(RedisIndexIntegrationTest, DocumentedAclUserRunsTheIndex) {
  StartServer();
  std::ifstream doc(PD_SOURCE_DIR "/docs/redis_index.md");
  ASSERT_TRUE(doc) << "docs/redis_index.md";
  std::string recipe;
  for (std::string line; std::getline(doc, line);) {
    const absl::string_view l = absl::StripAsciiWhitespace(line);
    if (absl::StartsWith(l, "ACL SETUSER ")) {
      recipe = std::string(l);
      break;
    }
  }
  ASSERT_FALSE(recipe.empty()) << "no ACL SETUSER line in docs/redis_index.md";
  constexpr char kPassword[] = "acl-test-password-0123456789";
  std::vector<std::string> args = absl::StrSplit(recipe, ' ', absl::SkipEmpty());
  bool has_password = false;
  for (std::string& a : args) {
    if (a == ">PASSWORD") {
      a = absl::StrCat(">", kPassword);
      has_password = true;
    }
  }
  ASSERT_TRUE(has_password) << recipe;
  auto admin = Client(Redis());
  ASSERT_NE(admin, nullptr);
  auto created = admin->Command(args);
  ASSERT_TRUE(created.ok()) << created.status() << "\n" << recipe;
  ASSERT_TRUE(created->ToStatus().ok()) << created->str << "\n" << recipe;

  // tierd and the router as the flags make them: default prefix, --redis_username=<the user>.
  RedisConfig acl = Redis("pdserve");
  acl.username = args[2];
  acl.password = kPassword;
  FakeHoldings holdings;
  holdings.Set({{H(9), tier_shm::TierKind::kNvme}});  // found by the first resync
  auto index = CreateIndex(acl, Index("node-a"), holdings);
  ASSERT_NE(index, nullptr);
  holdings.Put(*index, H(0), tier_shm::TierKind::kDram);
  holdings.Put(*index, H(1), tier_shm::TierKind::kNvme);
  holdings.Remove(*index, H(9));
  ASSERT_TRUE(index->Flush().ok());
  ASSERT_TRUE(PollUntil([&] { return index->Stats().resyncs_total >= 1; }));
  EXPECT_EQ(index->Stats().errors_total, 0u) << "a command the recipe does not allow";

  auto client = Client(acl);
  ASSERT_NE(client, nullptr);
  EXPECT_THAT(LookupOrEmpty(*client, "node-a", {H(0), H(1), H(2)}),
              ElementsAre(tier_shm::TierKind::kDram, tier_shm::TierKind::kNvme));
  const std::vector<BlockHash> chain = {H(0), H(1)};
  const redis::PrefixQuery queries[] = {{"node-a", chain}, {"node-b", chain}};
  auto batch = redis::LookupPrefixTiersBatch(*client, queries);
  ASSERT_TRUE(batch.ok()) << batch.status();
  EXPECT_EQ((*batch)[0].size(), 2u);
  auto nodes = redis::ScanSetMembers(*client, client->Key(redis::kPrefixNodesKey), 100);
  ASSERT_TRUE(nodes.ok()) << nodes.status();
  EXPECT_THAT(*nodes, ElementsAre("node-a"));
  // The peer announcement (PeerLink's SET ... PX) and its lookup.
  auto announced = client->Command(
      {"SET", client->Key(redis::PrefixPeerKey("node-a")), "127.0.0.1:1", "PX", "30000"});
  ASSERT_TRUE(announced.ok()) << announced.status();
  EXPECT_TRUE(announced->ToStatus().ok()) << announced->str;
  const std::string peer_nodes[] = {"node-a"};
  auto peers = redis::LookupPeerAddresses(*client, peer_nodes);
  ASSERT_TRUE(peers.ok()) << peers.status();
  EXPECT_THAT(*peers, ElementsAre("127.0.0.1:1"));
  index.reset();
  EXPECT_TRUE(RedisIndex::RemoveNode(*client, "node-a").ok());
  EXPECT_THAT(LookupOrEmpty(*client, "node-a", chain), IsEmpty());

  // The recipe confines the user: a key outside the prefix is refused.
  auto outside = client->Command({"SET", "other-cluster:blk:x", "dram"});
  EXPECT_FALSE(outside.ok() && outside->ToStatus().ok()) << "the ACL lets the user out";
}

// Garbage in the index (issue #40): entries pdserve never writes are skipped as before, but
// counted (pd_tierd_redis_garbage_total) and logged: an unknown tier value ends a lookup, a
// peer address that is no host:port reads as none, and a member of the node's own set that is
// no block hash is deleted by the resync.
TEST_F(RedisIndexIntegrationTest, GarbageIsCountedNotJustSkipped) {
  StartServer();
  auto client = Client(Redis());
  ASSERT_NE(client, nullptr);
  const std::vector<std::vector<std::string>> writes = {
      {"SET", client->Key(redis::PrefixBlockKey("n1", H(0))), "dram"},
      {"SET", client->Key(redis::PrefixBlockKey("n1", H(1))), "hbm"},
      {"SET", client->Key(redis::PrefixPeerKey("n1")), "not an address"},
      {"SADD", client->Key(redis::PrefixNodeBlocksKey("n1")), "zzz-not-a-hash"}};
  for (const auto& w : writes) {
    auto r = client->Command(w);
    ASSERT_TRUE(r.ok()) << r.status();
  }
  redis::PrefixGarbageCounter garbage;
  const std::vector<BlockHash> chain = {H(0), H(1)};
  auto tiers = redis::LookupPrefixTiers(*client, "n1", chain, 128, &garbage);
  ASSERT_TRUE(tiers.ok()) << tiers.status();
  EXPECT_THAT(*tiers, ElementsAre(redis::PrefixTier::kDram));
  EXPECT_EQ(garbage.total(redis::PrefixGarbage::kTierValue), 1u);
  const redis::PrefixQuery queries[] = {{"n1", chain}};
  ASSERT_TRUE(redis::LookupPrefixTiersBatch(*client, queries, &garbage).ok());
  EXPECT_EQ(garbage.total(redis::PrefixGarbage::kTierValue), 2u);
  const std::string nodes[] = {"n1"};
  auto peers = redis::LookupPeerAddresses(*client, nodes, &garbage);
  ASSERT_TRUE(peers.ok()) << peers.status();
  EXPECT_THAT(*peers, ElementsAre(""));
  EXPECT_EQ(garbage.total(redis::PrefixGarbage::kPeerAddress), 1u);

  FakeHoldings holdings;
  auto index = CreateIndex(Redis(), Index("n1"), holdings);
  ASSERT_NE(index, nullptr);
  ASSERT_TRUE(index->Flush().ok());
  EXPECT_EQ(index->garbage().total(redis::PrefixGarbage::kSetMember), 1u);
  EXPECT_THAT(Members(*client, client->Key(redis::PrefixNodeBlocksKey("n1"))), IsEmpty());
}

TEST_F(RedisIndexIntegrationTest, LookupFailsWhenRedisIsGone) {
  StartServer();
  auto client = Client(Redis());
  ASSERT_NE(client, nullptr);
  ASSERT_TRUE(server_->Stop().ok());
  auto tiers = RedisIndex::Lookup(*client, "n1", {H(1)});
  EXPECT_FALSE(tiers.ok());
  EXPECT_THAT(tiers.status().code(), ::testing::AnyOf(absl::StatusCode::kUnavailable,
                                                      absl::StatusCode::kDeadlineExceeded));
}

}  // namespace
}  // namespace pd::tierd
