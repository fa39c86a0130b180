#include "services/router/router_config.h"

#include <limits>

#include "gtest/gtest.h"

namespace pd::router {
namespace {

RouterConfig Valid() {
  RouterConfig c;
  c.model = "/models/m";
  c.decode_workers = {"127.0.0.1:1"};
  return c;
}

TEST(RouterConfigTest, DefaultsPlusModelAndWorkersAreValid) {
  EXPECT_TRUE(Valid().Validate().ok());
  RouterConfig c = Valid();
  c.model.clear();
  EXPECT_NE(c.Validate().message().find("--model"), absl::string_view::npos);
  c = Valid();
  c.decode_workers.clear();
  EXPECT_NE(c.Validate().message().find("--decode_workers"), absl::string_view::npos);
  c = Valid();
  c.policy = "best";
  EXPECT_NE(c.Validate().message().find("--policy"), absl::string_view::npos);
}

TEST(RouterConfigTest, RejectsBadValuesNamingTheFlag) {
  RouterConfig c = Valid();
  c.block_size = 0;
  absl::Status s = c.Validate();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("--block_size"), absl::string_view::npos) << s;

  c = Valid();
  c.metrics_address = c.grpc_address;
  s = c.Validate();
  EXPECT_NE(s.message().find("--metrics_address"), absl::string_view::npos) << s;

  c = Valid();
  c.redis.emplace();
  c.redis->port = 0;
  s = c.Validate();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("redis"), absl::string_view::npos) << s;

  c = Valid();
  c.limits.max_prompt_tokens = 0;
  EXPECT_EQ(c.Validate().code(), absl::StatusCode::kInvalidArgument);
}

TEST(RouterConfigTest, RejectsBadScorerWeightsNamingTheFlag) {
  RouterConfig c = Valid();
  c.dram_hit_weight = 1.5;
  absl::Status s = c.Validate();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("--dram_hit_weight"), absl::string_view::npos) << s;
  c = Valid();
  c.prefill_weight = -1;
  EXPECT_NE(c.Validate().message().find("--prefill_weight"), absl::string_view::npos);
  c = Valid();
  c.inflight_weight = std::numeric_limits<double>::quiet_NaN();
  EXPECT_NE(c.Validate().message().find("--inflight_weight"), absl::string_view::npos);
  c = Valid();
  c.backlog_prefill_weight = -2;
  EXPECT_NE(c.Validate().message().find("--backlog_prefill_weight"), absl::string_view::npos);
  c = Valid();
  c.min_hit_fraction = 1.5;
  EXPECT_NE(c.Validate().message().find("--min_hit_fraction"), absl::string_view::npos);
  c = Valid();
  c.index_max_blocks = 0;
  EXPECT_NE(c.Validate().message().find("--index_max_blocks"), absl::string_view::npos);
  c = Valid();
  c.nvme_hit_weight = 1;  // the bound itself is allowed
  EXPECT_TRUE(c.Validate().ok());
}

}  // namespace
}  // namespace pd::router
