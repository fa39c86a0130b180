#include "services/router/router_config.h"

#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "services/router/kv_index.h"

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

  for (absl::Duration bad : {absl::ZeroDuration(), absl::Microseconds(999), absl::Seconds(11)}) {
    c = Valid();
    c.redis_lookup_timeout = bad;
    s = c.Validate();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(s.message().find("--redis_lookup_timeout"), absl::string_view::npos) << s;
  }
  c = Valid();
  c.redis_lookup_timeout = absl::Seconds(10);
  EXPECT_TRUE(c.Validate().ok());

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
  c.inflight_blocks_weight = -1;
  EXPECT_NE(c.Validate().message().find("--inflight_blocks_weight"), absl::string_view::npos);
  c = Valid();
  c.remote_hit_weight = 1.5;
  EXPECT_NE(c.Validate().message().find("--remote_hit_weight"), absl::string_view::npos);
  c = Valid();
  c.index_max_blocks = -1;
  EXPECT_NE(c.Validate().message().find("--index_max_blocks"), absl::string_view::npos);
  c.index_max_blocks = 0;  // automatic
  EXPECT_TRUE(c.Validate().ok());
  EXPECT_EQ(AutoIndexBound(0), kAutoIndexMinBlocks);
  EXPECT_EQ(AutoIndexBound(8 * 640'000), 10'240'000);  // 8 workers x 640k-block pools
  c = Valid();
  c.nvme_hit_weight = 1;  // the bound itself is allowed
  EXPECT_TRUE(c.Validate().ok());
}

TEST(RouterConfigTest, RejectsBadSecurityAndLimitFlagsNamingTheFlag) {
  struct Case {
    std::function<void(RouterConfig*)> mutate;
    std::string flag;
  };
  for (const Case& c : std::vector<Case>{
           {[](RouterConfig* r) { r->max_streams_per_tenant = -1; }, "--max_streams_per_tenant"},
           {[](RouterConfig* r) { r->max_message_bytes = 100; }, "--max_message_bytes"},
           {[](RouterConfig* r) { r->max_message_bytes = int64_t{2} << 30; },
            "--max_message_bytes"},
           {[](RouterConfig* r) { r->tls.cert_file = "c.pem"; }, "--tls_key"},
           {[](RouterConfig* r) { r->tls.client_ca_file = "ca.pem"; }, "--tls_ca"},
           {[](RouterConfig* r) { r->worker_tls.cert_file = "c.pem"; }, "--client_tls_key"},
           {[](RouterConfig* r) {
              r->worker_tls.cert_file = "c.pem";
              r->worker_tls.key_file = "k.pem";
            },
            "--client_tls_ca"},
       }) {
    RouterConfig r = Valid();
    c.mutate(&r);
    const absl::Status s = r.Validate();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.flag;
    EXPECT_NE(s.message().find(c.flag), absl::string_view::npos) << s;
  }
  RouterConfig r = Valid();
  r.tls = {"c.pem", "k.pem", "ca.pem"};
  r.worker_tls = {"ca.pem", "c.pem", "k.pem"};
  r.max_streams_per_tenant = 8;
  EXPECT_TRUE(r.Validate().ok()) << r.Validate();  // files are read by RouterServer::Start
}

}  // namespace
}  // namespace pd::router
