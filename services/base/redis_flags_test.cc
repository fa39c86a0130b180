#include "services/base/redis_flags.h"

#include <fstream>

#include "absl/flags/flag.h"
#include "common/testing/temp_dir.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pd::services {
namespace {

using ::testing::HasSubstr;

class RedisFlagsTest : public ::testing::Test {
 protected:
  void TearDown() override {
    absl::SetFlag(&FLAGS_redis_address, "");
    absl::SetFlag(&FLAGS_redis_password_file, "");
    absl::SetFlag(&FLAGS_redis_username, "");
    absl::SetFlag(&FLAGS_redis_key_prefix, "pdserve");
  }
};

TEST_F(RedisFlagsTest, NoAddressIsNoRedis) {
  absl::SetFlag(&FLAGS_redis_username, "ignored");
  absl::StatusOr<std::optional<redis::RedisConfig>> config = RedisConfigFromFlags();
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_FALSE(config->has_value());
}

TEST_F(RedisFlagsTest, ReadsEveryFlag) {
  absl::StatusOr<pd::testing::TempDir> dir = pd::testing::TempDir::Create();
  ASSERT_TRUE(dir.ok()) << dir.status();
  const std::string password_file = dir->File("password");
  std::ofstream(password_file) << "s3cret\n";
  absl::SetFlag(&FLAGS_redis_address, "[::1]:6390");
  absl::SetFlag(&FLAGS_redis_password_file, password_file);
  absl::SetFlag(&FLAGS_redis_username, "router");

  absl::StatusOr<std::optional<redis::RedisConfig>> config = RedisConfigFromFlags();
  ASSERT_TRUE(config.ok()) << config.status();
  ASSERT_TRUE(config->has_value());
  const redis::RedisConfig& c = **config;
  EXPECT_EQ(c.host, "::1");
  EXPECT_EQ(c.port, 6390);
  EXPECT_EQ(c.username, "router");
  EXPECT_EQ(c.password, "s3cret");
  EXPECT_EQ(c.key_prefix, "pdserve");  // the default
  EXPECT_EQ(c.db, redis::RedisConfig().db);

  absl::SetFlag(&FLAGS_redis_key_prefix, "cluster-b");
  absl::SetFlag(&FLAGS_redis_password_file, "");
  config = RedisConfigFromFlags();
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ((*config)->key_prefix, "cluster-b");
  EXPECT_EQ((*config)->password, "");
}

TEST_F(RedisFlagsTest, ErrorsNameTheFlag) {
  absl::SetFlag(&FLAGS_redis_address, "localhost");  // no port
  absl::StatusOr<std::optional<redis::RedisConfig>> config = RedisConfigFromFlags();
  ASSERT_TRUE(absl::IsInvalidArgument(config.status())) << config.status();
  EXPECT_THAT(config.status().message(), HasSubstr("--redis_address"));

  absl::SetFlag(&FLAGS_redis_address, "127.0.0.1:6379");
  absl::SetFlag(&FLAGS_redis_password_file, "/nonexistent/pd-redis-password");
  config = RedisConfigFromFlags();
  ASSERT_FALSE(config.ok());
  EXPECT_THAT(config.status().message(), HasSubstr("--redis_password_file"));
}

}  // namespace
}  // namespace pd::services
