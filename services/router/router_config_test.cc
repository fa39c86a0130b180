#include "services/router/router_config.h"

#include "gtest/gtest.h"

namespace pd::router {
namespace {

TEST(RouterConfigTest, DefaultsAreValid) { EXPECT_TRUE(RouterConfig{}.Validate().ok()); }

TEST(RouterConfigTest, RejectsBadValuesNamingTheFlag) {
  RouterConfig c;
  c.block_size = 0;
  absl::Status s = c.Validate();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("--block_size"), absl::string_view::npos) << s;

  c = RouterConfig{};
  c.metrics_address = c.grpc_address;
  s = c.Validate();
  EXPECT_NE(s.message().find("--metrics_address"), absl::string_view::npos) << s;

  c = RouterConfig{};
  c.redis.emplace();
  c.redis->port = 0;
  s = c.Validate();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("redis"), absl::string_view::npos) << s;

  c = RouterConfig{};
  c.limits.max_prompt_tokens = 0;
  EXPECT_EQ(c.Validate().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace pd::router
