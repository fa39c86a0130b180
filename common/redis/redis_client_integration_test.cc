// Against a real redis-server child per test (pd::testing::RedisServer).
#include "common/redis/redis_client.h"

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/testing/net.h"
#include "common/testing/redis_server.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pd::redis {
namespace {

using ::testing::HasSubstr;

// ---- integration: a real redis-server child per test -------------------------------------------

using ::pd::testing::RedisServer;

class RedisClientIntegrationTest : public ::testing::Test {
 protected:
  void StartServer(RedisServer::Options options = {}) {
    auto server = RedisServer::Start(std::move(options));
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
  }

  // Short timeouts and backoff keep failure cases fast.
  RedisConfig Config() const {
    RedisConfig config;
    config.port = server_->port();
    config.password = server_->password();
    config.key_prefix = "pd:test:";
    config.connect_timeout = absl::Milliseconds(300);
    config.command_timeout = absl::Milliseconds(500);
    config.reconnect_backoff_initial = absl::Milliseconds(10);
    config.reconnect_backoff_max = absl::Milliseconds(40);
    config.max_reconnect_attempts = 3;
    return config;
  }

  std::unique_ptr<RedisClient> ConnectOrDie(const RedisConfig& config) {
    auto client = RedisClient::Connect(config);
    EXPECT_TRUE(client.ok()) << client.status();
    return client.ok() ? *std::move(client) : nullptr;
  }

  std::unique_ptr<RedisServer> server_;
};

TEST_F(RedisClientIntegrationTest, SetGetIsBinarySafe) {
  StartServer();
  auto client = ConnectOrDie(Config());
  ASSERT_NE(client, nullptr);
  std::string value("a\0b\r\nc\r\n\0", 9);
  for (int c = 0; c < 256; ++c) {
    value.push_back(static_cast<char>(c));
  }
  const std::string key = client->Key(std::string("k\0\r\n", 4));

  auto set = client->Command({"SET", key, value});
  ASSERT_TRUE(set.ok()) << set.status();
  EXPECT_EQ(*set, RedisReply::Status("OK"));
  auto get = client->Command({"GET", key});
  ASSERT_TRUE(get.ok()) << get.status();
  EXPECT_EQ(*get, RedisReply::String(value));
  auto len = client->Command({"STRLEN", key});
  ASSERT_TRUE(len.ok()) << len.status();
  EXPECT_EQ(*len, RedisReply::Integer(static_cast<int64_t>(value.size())));

  auto missing = client->Command({"GET", client->Key("missing")});
  ASSERT_TRUE(missing.ok()) << missing.status();
  EXPECT_TRUE(missing->is_nil());

  // Arrays, including nil elements.
  auto mget = client->Command({"MGET", key, client->Key("missing")});
  ASSERT_TRUE(mget.ok()) << mget.status();
  EXPECT_EQ(*mget, RedisReply::Array({RedisReply::String(value), RedisReply::Nil()}));
}

TEST_F(RedisClientIntegrationTest, PipelineOfThousandSetsThenGetsRoundTrips) {
  StartServer();
  auto client = ConnectOrDie(Config());
  ASSERT_NE(client, nullptr);
  constexpr int kN = 1000;
  std::vector<std::vector<std::string> > sets, gets;
  for (int i = 0; i < kN; ++i) {
    std::string key = client->Key(absl::StrCat("blk:", i));
    sets.push_back({"SET", key, absl::StrCat("node-", i % 7, "\0tier", std::string(1, '\0'), i)});
    gets.push_back({"GET", key});
  }
  auto set_replies = client->Pipeline(sets);
  ASSERT_TRUE(set_replies.ok()) << set_replies.status();
  ASSERT_EQ(set_replies->size(), kN);
  for (const RedisReply& r : *set_replies) {
    ASSERT_EQ(r, RedisReply::Status("OK"));
  }
  auto get_replies = client->Pipeline(gets);
  ASSERT_TRUE(get_replies.ok()) << get_replies.status();
  ASSERT_EQ(get_replies->size(), kN);
  for (int i = 0; i < kN; ++i) {
    ASSERT_EQ((*get_replies)[i], RedisReply::String(sets[i][2])) << i;
  }
  RedisClientStats stats = client->Stats();
  EXPECT_EQ(stats.num_calls, 2u);
  EXPECT_EQ(stats.num_commands, 2u * kN);
  EXPECT_EQ(stats.num_failed_calls, 0u);
  EXPECT_GT(stats.total_call_latency, absl::ZeroDuration());
}

TEST_F(RedisClientIntegrationTest, PipelineReportsPerCommandErrorAsElement) {
  StartServer();
  auto client = ConnectOrDie(Config());
  ASSERT_NE(client, nullptr);
  const std::string str_key = client->Key("a-string");
  auto replies = client->Pipeline({{"SET", str_key, "not a number"},
                                   {"INCR", str_key},
                                   {"LPUSH", str_key, "x"},
                                   {"SET", client->Key("n"), "41"},
                                   {"INCR", client->Key("n")}});
  ASSERT_TRUE(replies.ok()) << replies.status();
  ASSERT_EQ(replies->size(), 5u);
  EXPECT_EQ((*replies)[0], RedisReply::Status("OK"));
  ASSERT_TRUE((*replies)[1].is_error()) << (*replies)[1].DebugString();
  EXPECT_THAT((*replies)[1].str, HasSubstr("not an integer"));
  ASSERT_TRUE((*replies)[2].is_error()) << (*replies)[2].DebugString();
  EXPECT_TRUE(absl::IsFailedPrecondition((*replies)[2].ToStatus()));
  EXPECT_EQ((*replies)[3], RedisReply::Status("OK"));
  EXPECT_EQ((*replies)[4], RedisReply::Integer(42));
  EXPECT_EQ(client->Stats().num_error_replies, 2u);
  EXPECT_EQ(client->Stats().num_failed_calls, 0u);
}

TEST_F(RedisClientIntegrationTest, CommandErrorReplyIsAStatusAndConnectionStaysUp) {
  StartServer();
  auto client = ConnectOrDie(Config());
  ASSERT_NE(client, nullptr);
  const std::string key = client->Key("s");
  ASSERT_TRUE(client->Command({"SET", key, "abc"}).ok());
  auto incr = client->Command({"INCR", key});
  ASSERT_TRUE(absl::IsInvalidArgument(incr.status())) << incr.status();
  EXPECT_THAT(std::string(incr.status().message()),
              HasSubstr(absl::StrCat("redis 127.0.0.1:", server_->port(), ": INCR: ERR")));
  auto lpush = client->Command({"LPUSH", key, "x"});
  EXPECT_TRUE(absl::IsFailedPrecondition(lpush.status())) << lpush.status();
  auto unknown = client->Command({"NOSUCHCOMMAND"});
  EXPECT_TRUE(absl::IsInvalidArgument(unknown.status())) << unknown.status();

  auto get = client->Command({"GET", key});
  ASSERT_TRUE(get.ok()) << get.status();
  EXPECT_EQ(*get, RedisReply::String("abc"));
  EXPECT_EQ(client->Stats().num_reconnects, 0u);
  EXPECT_EQ(client->Stats().num_failed_calls, 3u);
}

TEST_F(RedisClientIntegrationTest, EmptyCommandsAreRejectedOrTrivial) {
  StartServer();
  auto client = ConnectOrDie(Config());
  ASSERT_NE(client, nullptr);
  EXPECT_TRUE(absl::IsInvalidArgument(client->Command({}).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(client->Pipeline({{"PING"}, {}}).status()));
  auto none = client->Pipeline({});
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_TRUE(none->empty());
  EXPECT_TRUE(client->Command({"PING"}).ok());
}

TEST_F(RedisClientIntegrationTest, AuthWithPasswordAndAclUser) {
  RedisServer::Options options;
  options.password = "s3cret";
  StartServer(options);

  auto client = ConnectOrDie(Config());
  ASSERT_NE(client, nullptr);
  auto pong = client->Command({"PING"});
  ASSERT_TRUE(pong.ok()) << pong.status();
  EXPECT_EQ(*pong, RedisReply::Status("PONG"));

  RedisConfig wrong = Config();
  wrong.password = "wrong";
  auto bad = RedisClient::Connect(wrong);
  ASSERT_TRUE(absl::IsUnauthenticated(bad.status())) << bad.status();
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("AUTH as user \"default\" rejected"));
  EXPECT_THAT(std::string(bad.status().message()), Not(HasSubstr("wrong")));  // no secrets

  RedisConfig none = Config();
  none.password.clear();
  auto unauth = RedisClient::Connect(none);
  ASSERT_TRUE(absl::IsUnauthenticated(unauth.status())) << unauth.status();
  EXPECT_THAT(std::string(unauth.status().message()), HasSubstr("requires AUTH"));

  // Redis 6+ ACL user: AUTH username password.
  ASSERT_TRUE(
      client->Command({"ACL", "SETUSER", "alice", "on", ">alicepw", "~*", "&*", "+@all"}).ok());
  RedisConfig alice = Config();
  alice.username = "alice";
  alice.password = "alicepw";
  auto alice_client = ConnectOrDie(alice);
  ASSERT_NE(alice_client, nullptr);
  auto whoami = alice_client->Command({"ACL", "WHOAMI"});
  ASSERT_TRUE(whoami.ok()) << whoami.status();
  EXPECT_EQ(whoami->str, "alice");
  alice.password = "nope";
  EXPECT_TRUE(absl::IsUnauthenticated(RedisClient::Connect(alice).status()));
}

TEST_F(RedisClientIntegrationTest, SelectsDb) {
  StartServer();
  RedisConfig db3 = Config();
  db3.db = 3;
  auto client3 = ConnectOrDie(db3);
  auto client0 = ConnectOrDie(Config());
  ASSERT_NE(client3, nullptr);
  ASSERT_NE(client0, nullptr);
  ASSERT_TRUE(client3->Command({"SET", "k", "in-db-3"}).ok());
  auto get0 = client0->Command({"GET", "k"});
  ASSERT_TRUE(get0.ok()) << get0.status();
  EXPECT_TRUE(get0->is_nil());

  RedisConfig db99 = Config();
  db99.db = 99;
  auto bad = RedisClient::Connect(db99);
  ASSERT_TRUE(absl::IsInvalidArgument(bad.status())) << bad.status();
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("SELECT 99"));
}

TEST_F(RedisClientIntegrationTest, ReconnectsAfterServerRestart) {
  StartServer();
  auto client = ConnectOrDie(Config());
  ASSERT_NE(client, nullptr);
  ASSERT_TRUE(client->Command({"SET", client->Key("k"), "v"}).ok());

  ASSERT_TRUE(server_->Restart().ok());
  // The old connection is dead; this call notices, reconnects and re-sends.
  auto set = client->Command({"SET", client->Key("k"), "v2"});
  ASSERT_TRUE(set.ok()) << set.status();
  auto get = client->Command({"GET", client->Key("k")});
  ASSERT_TRUE(get.ok()) << get.status();
  EXPECT_EQ(*get, RedisReply::String("v2"));
  RedisClientStats stats = client->Stats();
  EXPECT_EQ(stats.num_reconnects, 1u);
  EXPECT_EQ(stats.num_failed_calls, 0u);

  // Pipelines are retried whole the same way.
  ASSERT_TRUE(server_->Restart().ok());
  auto replies = client->Pipeline({{"SET", client->Key("p"), "1"}, {"GET", client->Key("p")}});
  ASSERT_TRUE(replies.ok()) << replies.status();
  EXPECT_EQ((*replies)[1], RedisReply::String("1"));
  EXPECT_EQ(client->Stats().num_reconnects, 2u);
}

TEST_F(RedisClientIntegrationTest, StoppedServerGivesUnavailableWithinBoundThenRecovers) {
  StartServer();
  auto client = ConnectOrDie(Config());
  ASSERT_NE(client, nullptr);
  ASSERT_TRUE(server_->Stop().ok());

  const absl::Time start = absl::Now();
  auto get = client->Command({"GET", client->Key("k")});
  const absl::Duration elapsed = absl::Now() - start;
  ASSERT_TRUE(absl::IsUnavailable(get.status())) << get.status();
  const std::string message(get.status().message());
  EXPECT_THAT(message, HasSubstr(absl::StrCat("redis 127.0.0.1:", server_->port(), ": GET: ")));
  EXPECT_THAT(message, HasSubstr("connection refused"));
  // 4 tries with 10 + 20 + 40 ms of backoff between them.
  EXPECT_LT(elapsed, absl::Seconds(1));
  RedisClientStats stats = client->Stats();
  EXPECT_EQ(stats.num_failed_calls, 1u);
  EXPECT_EQ(stats.num_connect_failures, 3u);

  // The next call on a dropped connection reconnects first, without a retry budget being
  // needed: the server is back.
  ASSERT_TRUE(server_->Restart().ok());
  auto pong = client->Command({"PING"});
  ASSERT_TRUE(pong.ok()) << pong.status();
  EXPECT_EQ(client->Stats().num_reconnects, 1u);
}

TEST_F(RedisClientIntegrationTest, NoRetryConfigFailsAfterOneTry) {
  StartServer();
  RedisConfig config = Config();
  config.max_reconnect_attempts = 0;
  auto client = ConnectOrDie(config);
  ASSERT_NE(client, nullptr);
  ASSERT_TRUE(server_->Restart().ok());
  // The dead connection fails the call (the command is not re-sent) ...
  auto incr = client->Command({"INCR", client->Key("counter")});
  ASSERT_TRUE(absl::IsUnavailable(incr.status())) << incr.status();
  EXPECT_THAT(std::string(incr.status().message()), HasSubstr("after 1 try"));
  // ... and the next call reconnects.
  auto again = client->Command({"INCR", client->Key("counter")});
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(*again, RedisReply::Integer(1));
}

TEST_F(RedisClientIntegrationTest, CommandTimeoutIsDeadlineExceededThenReconnects) {
  StartServer();
  RedisConfig config = Config();
  config.command_timeout = absl::Milliseconds(100);
  auto client = ConnectOrDie(config);
  ASSERT_NE(client, nullptr);
  const absl::Time start = absl::Now();
  // Blocks server-side for 2 s on an empty list: the client must give up after ~100 ms.
  auto blpop = client->Command({"BLPOP", client->Key("empty-list"), "2"});
  const absl::Duration elapsed = absl::Now() - start;
  ASSERT_TRUE(absl::IsDeadlineExceeded(blpop.status())) << blpop.status();
  EXPECT_THAT(std::string(blpop.status().message()), HasSubstr("BLPOP"));
  EXPECT_LT(elapsed, absl::Milliseconds(900));
  auto pong = client->Command({"PING"});
  ASSERT_TRUE(pong.ok()) << pong.status();
  EXPECT_EQ(client->Stats().num_reconnects, 1u);
}

TEST_F(RedisClientIntegrationTest, ConcurrentCallersShareOneClient) {
  StartServer();
  auto client = ConnectOrDie(Config());
  ASSERT_NE(client, nullptr);
  constexpr int kThreads = 4;
  constexpr int kOps = 100;
  std::vector<std::thread> threads;
  std::vector<int> failures(kThreads, 0);
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kOps; ++i) {
        std::string key = client->Key(absl::StrCat("t", t, ":", i));
        std::string value = absl::StrCat(t * 1000 + i);
        auto set = client->Command({"SET", key, value});
        auto get = client->Command({"GET", key});
        if (!set.ok() || !get.ok() || *get != RedisReply::String(value)) {
          ++failures[t];
        }
      }
    });
  }
  for (std::thread& th : threads) {
    th.join();
  }
  for (int t = 0; t < kThreads; ++t) {
    EXPECT_EQ(failures[t], 0) << "thread " << t;
  }
  EXPECT_EQ(client->Stats().num_calls, 2u * kThreads * kOps);
}

TEST(RedisServerTest, StopIsIdempotentAndLogIsKept) {
  auto server = RedisServer::Start({});
  ASSERT_TRUE(server.ok()) << server.status();
  EXPECT_TRUE((*server)->running());
  EXPECT_GT((*server)->port(), 0);
  EXPECT_THAT((*server)->LogTail(), HasSubstr("Ready to accept connections"));
  EXPECT_TRUE((*server)->Stop().ok());
  EXPECT_FALSE((*server)->running());
  EXPECT_TRUE((*server)->Stop().ok());
}

TEST(RedisServerTest, MissingBinaryIsNotFound) {
  RedisServer::Options options;
  options.binary = "/nonexistent/redis-server";
  auto server = RedisServer::Start(options);
  EXPECT_TRUE(absl::IsNotFound(server.status())) << server.status();
}

}  // namespace
}  // namespace pd::redis
