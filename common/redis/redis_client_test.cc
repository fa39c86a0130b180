// Hermetic unit cases: config validation, reply helpers, connecting to a closed port.
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
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pd::redis {
namespace {

using ::testing::HasSubstr;

// ---- unit: config, reply type, error mapping, connect failure (no server) ----------------------

TEST(RedisConfigTest, DefaultsAreValid) {
  RedisConfig config;
  EXPECT_TRUE(config.Validate().ok()) << config.Validate();
  EXPECT_EQ(config.host, "127.0.0.1");
  EXPECT_EQ(config.port, 6379);
  EXPECT_EQ(config.connect_timeout, absl::Milliseconds(500));
  EXPECT_EQ(config.command_timeout, absl::Seconds(1));
}

struct BadConfigCase {
  std::string name;
  void (*mutate)(RedisConfig&);
  std::vector<std::string> expected_substrings;  // field name and offending value

  friend void PrintTo(const BadConfigCase& c, std::ostream* os) { *os << c.name; }
};

class RedisConfigValidateTest : public ::testing::TestWithParam<BadConfigCase> {};

TEST_P(RedisConfigValidateTest, RejectsWithFieldAndValue) {
  RedisConfig config;
  GetParam().mutate(config);
  absl::Status s = config.Validate();
  ASSERT_TRUE(absl::IsInvalidArgument(s)) << s;
  for (const std::string& sub : GetParam().expected_substrings) {
    EXPECT_THAT(std::string(s.message()), HasSubstr(sub));
  }
}

INSTANTIATE_TEST_SUITE_P(
    BadFields, RedisConfigValidateTest,
    ::testing::Values(
        BadConfigCase{"PortZero", [](RedisConfig& c) { c.port = 0; }, {"port", "got 0"}},
        BadConfigCase{"PortTooLarge", [](RedisConfig& c) { c.port = 70000; }, {"port", "70000"}},
        BadConfigCase{"EmptyHost", [](RedisConfig& c) { c.host = ""; }, {"host", "\"\""}},
        BadConfigCase{"NegativeConnectTimeout",
                      [](RedisConfig& c) { c.connect_timeout = absl::Milliseconds(-5); },
                      {"connect_timeout", "-5ms"}},
        BadConfigCase{"ZeroCommandTimeout",
                      [](RedisConfig& c) { c.command_timeout = absl::ZeroDuration(); },
                      {"command_timeout", "got 0"}},
        BadConfigCase{"NegativeCommandTimeout",
                      [](RedisConfig& c) { c.command_timeout = absl::Seconds(-1); },
                      {"command_timeout", "-1s"}},
        BadConfigCase{"InfiniteCommandTimeout",
                      [](RedisConfig& c) { c.command_timeout = absl::InfiniteDuration(); },
                      {"command_timeout", "inf"}},
        BadConfigCase{"NegativeBackoff",
                      [](RedisConfig& c) { c.reconnect_backoff_initial = absl::Milliseconds(-1); },
                      {"reconnect_backoff_initial", "-1ms"}},
        BadConfigCase{"MaxBackoffBelowInitial",
                      [](RedisConfig& c) {
                        c.reconnect_backoff_initial = absl::Milliseconds(100);
                        c.reconnect_backoff_max = absl::Milliseconds(50);
                      },
                      {"reconnect_backoff_max", "50ms", "100ms"}},
        BadConfigCase{"NegativeAttempts",
                      [](RedisConfig& c) { c.max_reconnect_attempts = -1; },
                      {"max_reconnect_attempts", "-1"}},
        BadConfigCase{"NegativeDb", [](RedisConfig& c) { c.db = -2; }, {"db", "-2"}},
        BadConfigCase{"UsernameWithoutPassword",
                      [](RedisConfig& c) { c.username = "alice"; },
                      {"username", "alice", "password"}}),
    [](const ::testing::TestParamInfo<BadConfigCase>& info) { return info.param.name; });

TEST(RedisConfigTest, KeyAppliesPrefixBinarySafe) {
  RedisConfig config;
  config.key_prefix = "pd:cluster-a:";
  EXPECT_EQ(config.Key("blk:1"), "pd:cluster-a:blk:1");
  EXPECT_EQ(config.Key(absl::string_view("a\0b", 3)), std::string("pd:cluster-a:a\0b", 16));
  config.key_prefix.clear();
  EXPECT_EQ(config.Key("x"), "x");
  // Without a trailing ':' one is added, so ACL patterns like ~pdserve:* cover every key.
  config.key_prefix = "pdserve";
  EXPECT_EQ(config.Key("blk:n:0a"), "pdserve:blk:n:0a");
  EXPECT_EQ(config.Key("nodes"), "pdserve:nodes");
}

TEST(RedisReplyTest, EqualityAndDebugString) {
  RedisReply array = RedisReply::Array({RedisReply::Integer(7), RedisReply::Nil(),
                                        RedisReply::String(std::string("a\0\r\n", 4)),
                                        RedisReply::Status("OK"), RedisReply::Error("ERR x")});
  EXPECT_EQ(array, array);
  EXPECT_NE(RedisReply::String("OK"), RedisReply::Status("OK"));
  EXPECT_NE(RedisReply::Integer(1), RedisReply::Integer(2));
  EXPECT_EQ(array.DebugString(),
            "[(integer) 7, (nil), \"a\\x00\\r\\n\", (status) OK, (error) ERR x]");
  EXPECT_TRUE(RedisReply::Integer(1).ToStatus().ok());
  EXPECT_TRUE(absl::IsFailedPrecondition(RedisReply::Error("WRONGTYPE bad").ToStatus()));
}

TEST(RedisErrorToStatusTest, MapsErrorPrefixes) {
  EXPECT_TRUE(absl::IsUnauthenticated(RedisErrorToStatus("NOAUTH Authentication required.")));
  EXPECT_TRUE(absl::IsUnauthenticated(RedisErrorToStatus("WRONGPASS invalid username-password")));
  EXPECT_TRUE(absl::IsPermissionDenied(RedisErrorToStatus("NOPERM this user has no permissions")));
  EXPECT_TRUE(absl::IsFailedPrecondition(RedisErrorToStatus("WRONGTYPE Operation against")));
  EXPECT_TRUE(absl::IsResourceExhausted(RedisErrorToStatus("OOM command not allowed")));
  EXPECT_TRUE(absl::IsUnavailable(RedisErrorToStatus("LOADING Redis is loading")));
  EXPECT_TRUE(absl::IsUnimplemented(RedisErrorToStatus("MOVED 3999 127.0.0.1:6381")));
  absl::Status generic = RedisErrorToStatus("ERR value is not an integer or out of range");
  EXPECT_TRUE(absl::IsInvalidArgument(generic));
  EXPECT_EQ(generic.message(), "ERR value is not an integer or out of range");
  EXPECT_TRUE(absl::IsInvalidArgument(RedisErrorToStatus("")));
}

TEST(RedisClientTest, ConnectRejectsInvalidConfig) {
  RedisConfig config;
  config.port = 0;
  auto client = RedisClient::Connect(config);
  EXPECT_TRUE(absl::IsInvalidArgument(client.status())) << client.status();
}

TEST(RedisClientTest, ConnectToClosedPortIsUnavailableAndQuick) {
  absl::StatusOr<int> port = pd::testing::PickFreeLoopbackPort();
  ASSERT_TRUE(port.ok()) << port.status();
  RedisConfig config;
  config.port = *port;
  const absl::Time start = absl::Now();
  auto client = RedisClient::Connect(config);
  const absl::Duration elapsed = absl::Now() - start;
  ASSERT_TRUE(absl::IsUnavailable(client.status())) << client.status();
  EXPECT_THAT(std::string(client.status().message()),
              HasSubstr(absl::StrCat("redis 127.0.0.1:", *port, ": ")));
  EXPECT_THAT(std::string(client.status().message()), HasSubstr("connection refused"));
  EXPECT_LT(elapsed, absl::Milliseconds(400));  // refused at once, no retry, no timeout wait
}

}  // namespace
}  // namespace pd::redis
