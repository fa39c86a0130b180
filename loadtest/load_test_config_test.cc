#include "loadtest/load_test_config.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pd::loadtest {
namespace {

using ::testing::HasSubstr;

LoadTestConfig Closed() {
  LoadTestConfig c;
  c.concurrency = 4;
  c.num_requests = 10;
  return c;
}

void ExpectInvalid(const LoadTestConfig& c, const std::string& message) {
  const absl::Status s = c.Validate();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << message;
  EXPECT_THAT(std::string(s.message()), HasSubstr(message));
}

TEST(LoadTestConfigTest, ValidClosedLoop) {
  ASSERT_TRUE(Closed().Validate().ok()) << Closed().Validate();
  EXPECT_EQ(*Closed().ResolveArrival(), ArrivalMode::kClosed);
}

TEST(LoadTestConfigTest, PenaltiesInTheServersRanges) {
  LoadTestConfig c = Closed();
  c.penalties.presence_penalty = 2.5;
  ExpectInvalid(c, "--presence_penalty must be in [-2, 2], got 2.5");
  c.penalties.presence_penalty = 0;
  c.penalties.min_p = -0.1;
  ExpectInvalid(c, "--min_p must be in [0, 1]");
  c.penalties.min_p = 0;
  c.penalties.repetition_penalty = -1;
  ExpectInvalid(c, "--repetition_penalty must be > 0");
  c.penalties.repetition_penalty = 1.1;
  c.penalties.frequency_penalty = -2;
  c.penalties.min_p = 0.05;
  EXPECT_TRUE(c.Validate().ok()) << c.Validate();
}

TEST(LoadTestConfigTest, JsonSchemaNeedsIgnoreEosOff) {
  LoadTestConfig c = Closed();
  c.json_schema = R"({"type":"object"})";
  ExpectInvalid(c, "--json_schema needs --ignore_eos=false");
  c.ignore_eos = false;
  EXPECT_TRUE(c.Validate().ok()) << c.Validate();
}

TEST(LoadTestConfigTest, AutoArrival) {
  LoadTestConfig c = Closed();
  c.request_rate = 5;
  EXPECT_EQ(*c.ResolveArrival(), ArrivalMode::kPoisson);  // concurrency is then a cap
  c.burstiness = 0.5;
  EXPECT_EQ(*c.ResolveArrival(), ArrivalMode::kGamma);
  LoadTestConfig t;
  t.workload = "trace";
  t.trace = "x.jsonl";
  EXPECT_EQ(*t.ResolveArrival(), ArrivalMode::kTrace);
  EXPECT_TRUE(t.Validate().ok()) << t.Validate();  // a trace is finite: no bound needed
  LoadTestConfig none;
  none.num_requests = 1;
  ExpectInvalid(none, "choose an arrival process");
}

TEST(LoadTestConfigTest, WorkloadNames) {
  LoadTestConfig c = Closed();
  c.workload = "shared-prefix";
  EXPECT_EQ(c.WorkloadName(), "shared_prefix");
  EXPECT_TRUE(c.Validate().ok());
  c.workload = "multi-turn";
  EXPECT_EQ(c.WorkloadName(), "multi_turn");
  EXPECT_TRUE(c.Validate().ok());
  c.workload = "chat";
  ExpectInvalid(c, "--workload must be synthetic, shared_prefix, multi_turn or trace");
}

TEST(LoadTestConfigTest, RejectsInvalidMultiTurnValues) {
  LoadTestConfig c = Closed();
  c.workload = "multi_turn";
  EXPECT_TRUE(c.Validate().ok());
  c.num_conversations = 0;
  ExpectInvalid(c, "--num_conversations must be in [1, 1000000], got 0");
  c = Closed();
  c.workload = "multi_turn";
  c.num_turns = 0;
  ExpectInvalid(c, "--num_turns must be >= 1, got 0");
  c = Closed();
  c.workload = "multi_turn";
  c.user_len = "uniform:5";
  ExpectInvalid(c, "--user_len: ");
  c = Closed();
  c.workload = "multi_turn";
  c.system_prompt_len = -1;
  ExpectInvalid(c, "--system_prompt_len must be >= 0, got -1");
  c = Closed();
  c.workload = "multi_turn";
  c.max_input_len = -5;
  ExpectInvalid(c, "--max_input_len must be >= 0, got -5");
}

TEST(LoadTestConfigTest, RejectsInvalidValues) {
  LoadTestConfig c = Closed();
  c.num_requests = 0;
  ExpectInvalid(c, "needs a bound");
  c = Closed();
  c.input_len = "uniform:9,3";
  ExpectInvalid(c, "--input_len: length spec 'uniform:9,3'");
  c = Closed();
  c.arrival = "closed";
  c.concurrency = 0;
  ExpectInvalid(c, "--arrival=closed needs --concurrency >= 1");
  c = Closed();
  c.arrival = "poisson";
  ExpectInvalid(c, "--arrival=poisson needs --request_rate > 0");
  c = Closed();
  c.arrival = "trace";
  ExpectInvalid(c, "--arrival=trace needs --workload=trace");
  c = Closed();
  c.trace = "x.jsonl";
  ExpectInvalid(c, "--trace is only used with --workload=trace");
  c = Closed();
  c.workload = "trace";
  ExpectInvalid(c, "--workload=trace needs --trace=PATH");
  c.trace = "x";
  c.on_bad_line = "ignore";
  ExpectInvalid(c, "--on_bad_line must be 'abort' or 'skip'");
  c.on_bad_line = "skip";
  c.time_scale = 0;
  ExpectInvalid(c, "--time_scale must be > 0");
  c = Closed();
  c.vocab_size = 3;
  ExpectInvalid(c, "--vocab_lo (3) must be < --vocab_size (3)");
  c = Closed();
  c.num_channels = 0;
  ExpectInvalid(c, "--num_channels must be in [1, 64]");
  c = Closed();
  c.slo_ttft_ms = -1;
  ExpectInvalid(c, "--slo_ttft_ms");
  c = Closed();
  c.progress = "fancy";
  ExpectInvalid(c, "--progress must be");
  c = Closed();
  c.request_rate = 1;
  c.arrival = "poisson";
  c.burstiness = 2;
  ExpectInvalid(c, "--burstiness applies to --arrival=gamma");
}

TEST(LoadTestConfigTest, RateSweep) {
  LoadTestConfig c;
  c.num_requests = 10;
  c.request_rates = "1, 2.5,4";
  ASSERT_TRUE(c.Validate().ok()) << c.Validate();
  EXPECT_EQ(*c.ResolveArrival(), ArrivalMode::kPoisson);
  EXPECT_THAT(*c.SweepRates(), ::testing::ElementsAre(1, 2.5, 4));
  c.burstiness = 0.5;
  EXPECT_EQ(*c.ResolveArrival(), ArrivalMode::kGamma);
  c.burstiness = 1;

  LoadTestConfig bad = c;
  bad.request_rates = "1,,2";
  ExpectInvalid(bad, "--request_rates has an empty item");
  bad.request_rates = "1,0";
  ExpectInvalid(bad, "--request_rates must list rates > 0");
  bad.request_rates = "fast";
  ExpectInvalid(bad, "'fast' is not a number");
  bad = c;
  bad.request_rate = 3;
  ExpectInvalid(bad, "exclusive");
  bad = c;
  bad.arrival = "closed";
  bad.concurrency = 4;
  ExpectInvalid(bad, "--request_rates needs an open-loop arrival");
  LoadTestConfig compared = c;  // a compared sweep runs both targets at each rate
  compared.compare_target = "127.0.0.1:2";
  EXPECT_TRUE(compared.Validate().ok());
  bad = c;
  bad.output_csv = "x.csv";
  ExpectInvalid(bad, "use --output_dir");
}

TEST(LoadTestConfigTest, CompareMode) {
  LoadTestConfig c = Closed();
  c.compare_target = "127.0.0.1:2";
  ASSERT_TRUE(c.Validate().ok()) << c.Validate();
  EXPECT_TRUE(c.compare());
  c.output_csv = "x.csv";
  ExpectInvalid(c, "use --output_dir");
}

}  // namespace
}  // namespace pd::loadtest
