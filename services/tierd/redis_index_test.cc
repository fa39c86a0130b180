// Hermetic: key formatting, coalescing, command building, config validation, and RedisIndex
// against a loopback port nothing listens on (Redis down).
#include "services/tierd/redis_index.h"

#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/testing/net.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pd::tierd {
namespace {

using redis_index_internal::BuildUpdateCommands;
using redis_index_internal::PendingUpdates;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::UnorderedElementsAre;

BlockHash H(uint64_t n) { return BlockHash{0x0123456789abcdefULL, n}; }

TEST(RedisIndexTiersTest, ConvertsToAndFromPrefixTiers) {
  for (tier_shm::TierKind tier : {tier_shm::TierKind::kDram, tier_shm::TierKind::kNvme}) {
    EXPECT_EQ(FromPrefixTier(ToPrefixTier(tier)), tier);
  }
  EXPECT_EQ(ToPrefixTier(tier_shm::TierKind::kNvme), redis::PrefixTier::kNvme);
  EXPECT_EQ(ToPrefixTier(tier_shm::TierKind::kDram), redis::PrefixTier::kDram);
}

TEST(RedisIndexConfigTest, ValidatesEveryField) {
  RedisIndexConfig ok;
  ok.node = "n1";
  EXPECT_TRUE(ok.Validate().ok());

  auto expect_invalid = [&](auto mutate, absl::string_view field) {
    RedisIndexConfig c = ok;
    mutate(c);
    absl::Status s = c.Validate();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << field;
    EXPECT_THAT(s.message(), HasSubstr(field));
  };
  expect_invalid([](RedisIndexConfig& c) { c.node = ""; }, "node");
  expect_invalid([](RedisIndexConfig& c) { c.node = "a:b"; }, "node");
  expect_invalid([](RedisIndexConfig& c) { c.entry_ttl = absl::Milliseconds(999); }, "entry_ttl");
  expect_invalid([](RedisIndexConfig& c) { c.entry_ttl = absl::InfiniteDuration(); }, "entry_ttl");
  expect_invalid([](RedisIndexConfig& c) { c.max_batch = 0; }, "max_batch");
  expect_invalid([](RedisIndexConfig& c) { c.max_batch = 1'000'001; }, "max_batch");
  expect_invalid([](RedisIndexConfig& c) { c.max_pending = 0; }, "max_pending");
  expect_invalid([](RedisIndexConfig& c) { c.flush_interval = absl::ZeroDuration(); },
                 "flush_interval");
  expect_invalid([](RedisIndexConfig& c) { c.retry_interval = -absl::Seconds(1); },
                 "retry_interval");
}

TEST(PendingUpdatesTest, LastOperationPerHashWins) {
  PendingUpdates pending(10);
  EXPECT_TRUE(pending.Add(H(1), true, tier_shm::TierKind::kDram));
  EXPECT_TRUE(pending.Add(H(1), true, tier_shm::TierKind::kNvme));
  EXPECT_TRUE(pending.Add(H(2), true, tier_shm::TierKind::kDram));
  EXPECT_TRUE(pending.Add(H(2), false, tier_shm::TierKind::kDram));
  EXPECT_TRUE(pending.Add(H(3), false, tier_shm::TierKind::kDram));
  EXPECT_TRUE(pending.Add(H(3), true, tier_shm::TierKind::kDram));
  EXPECT_EQ(pending.size(), 3);

  std::vector<PendingUpdates::Update> taken = pending.TakeAll();
  EXPECT_EQ(pending.size(), 0);
  ASSERT_EQ(taken.size(), 3u);
  std::vector<std::string> seen;
  for (const auto& u : taken) {
    seen.push_back(absl::StrCat(u.hash.low, u.publish ? "+" : "-",
                                u.publish ? redis::PrefixTierValue(ToPrefixTier(u.tier)) : ""));
  }
  EXPECT_THAT(seen, UnorderedElementsAre("1+nvme", "2-", "3+dram"));
}

TEST(PendingUpdatesTest, BoundedButQueuedHashesStillUpdate) {
  PendingUpdates pending(2);
  EXPECT_TRUE(pending.Add(H(1), true, tier_shm::TierKind::kDram));
  EXPECT_TRUE(pending.Add(H(2), true, tier_shm::TierKind::kDram));
  EXPECT_FALSE(pending.Add(H(3), true, tier_shm::TierKind::kDram));  // full: a new hash is refused
  EXPECT_TRUE(pending.Add(H(1), false, tier_shm::TierKind::kDram));  // a queued one still coalesces
  EXPECT_EQ(pending.size(), 2);
  pending.Clear();
  EXPECT_EQ(pending.size(), 0);
  EXPECT_TRUE(pending.Add(H(3), true, tier_shm::TierKind::kDram));
}

TEST(BuildUpdateCommandsTest, OneCommandPerUpdatePlusOneSaddAndOneSrem) {
  redis::RedisConfig config;
  config.key_prefix = "p:";
  const std::vector<PendingUpdates::Update> updates = {{H(1), true, tier_shm::TierKind::kDram},
                                                       {H(2), false, tier_shm::TierKind::kDram},
                                                       {H(3), true, tier_shm::TierKind::kNvme}};
  const std::string h1 = H(1).ToHex(), h2 = H(2).ToHex(), h3 = H(3).ToHex();
  EXPECT_THAT(BuildUpdateCommands(config, "n1", 600, updates),
              ElementsAre(ElementsAre("SET", "p:blk:n1:" + h1, "dram", "EX", "600"),
                          ElementsAre("DEL", "p:blk:n1:" + h2),
                          ElementsAre("SET", "p:blk:n1:" + h3, "nvme", "EX", "600"),
                          ElementsAre("SADD", "p:node:n1:blocks", h1, h3),
                          ElementsAre("SREM", "p:node:n1:blocks", h2)));

  // No SADD without publishes, no SREM without unpublishes, nothing for nothing.
  const std::vector<PendingUpdates::Update> only_del = {{H(2), false, tier_shm::TierKind::kDram}};
  EXPECT_THAT(BuildUpdateCommands(config, "n1", 5, only_del),
              ElementsAre(ElementsAre("DEL", "p:blk:n1:" + h2),
                          ElementsAre("SREM", "p:node:n1:blocks", h2)));
  EXPECT_TRUE(BuildUpdateCommands(config, "n1", 5, {}).empty());
}

RedisIndex::SnapshotFn EmptySnapshot() {
  return [] { return std::vector<std::pair<BlockHash, tier_shm::TierKind>>(); };
}

TEST(RedisIndexTest, CreateRejectsBadConfig) {
  RedisIndexConfig config;  // node missing
  auto index = RedisIndex::Create(redis::RedisConfig(), config, EmptySnapshot());
  EXPECT_EQ(index.status().code(), absl::StatusCode::kInvalidArgument);

  config.node = "n1";
  redis::RedisConfig bad_redis;
  bad_redis.port = 0;
  index = RedisIndex::Create(bad_redis, config, EmptySnapshot());
  EXPECT_EQ(index.status().code(), absl::StatusCode::kInvalidArgument);

  index = RedisIndex::Create(redis::RedisConfig(), config, nullptr);
  EXPECT_EQ(index.status().code(), absl::StatusCode::kInvalidArgument);
}

// Redis down: Create succeeds, updates are queued (coalesced, bounded), Flush says Unavailable.
TEST(RedisIndexTest, QueuesWhileRedisIsDown) {
  auto port = pd::testing::PickFreeLoopbackPort();
  ASSERT_TRUE(port.ok()) << port.status();
  redis::RedisConfig redis;
  redis.port = *port;  // nothing listens there
  redis.connect_timeout = absl::Milliseconds(200);
  RedisIndexConfig config;
  config.node = "n1";
  config.max_pending = 3;
  config.retry_interval = absl::Milliseconds(20);
  auto index = RedisIndex::Create(redis, config, EmptySnapshot());
  ASSERT_TRUE(index.ok()) << index.status();

  (*index)->Publish(H(1), tier_shm::TierKind::kDram);
  (*index)->Publish(H(1), tier_shm::TierKind::kNvme);
  (*index)->Publish(H(2), tier_shm::TierKind::kDram);
  (*index)->Unpublish(H(2));
  (*index)->Unpublish(H(3));
  (*index)->Publish(H(4), tier_shm::TierKind::kDram);  // fourth distinct hash: dropped
  RedisIndexStats stats = (*index)->Stats();
  EXPECT_FALSE(stats.connected);
  EXPECT_EQ(stats.pending, 3);
  EXPECT_EQ(stats.dropped_total, 1u);

  absl::Status flushed = (*index)->Flush();
  EXPECT_EQ(flushed.code(), absl::StatusCode::kUnavailable) << flushed;
  stats = (*index)->Stats();
  EXPECT_FALSE(stats.connected);
  EXPECT_EQ(stats.pending, 3);  // still queued for when Redis comes
  EXPECT_GE(stats.errors_total, 1u);
  EXPECT_EQ(stats.published_total, 0u);
  EXPECT_EQ(stats.resyncs_total, 0u);
}

}  // namespace
}  // namespace pd::tierd
