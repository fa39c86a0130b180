// LoadRun end to end in-process (config -> readiness check -> run -> JSON/CSV reports) against
// the fake Generation server on 127.0.0.1.
#include "loadtest/load_run.h"

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/testing/net.h"
#include "common/testing/temp_dir.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "loadtest/testing/fake_generation_server.h"

namespace pd::loadtest {
namespace {

using testing::FakeGenerationServer;
using testing::FakeGenerationServerOptions;
using ::testing::HasSubstr;
using ::testing::StartsWith;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

class LoadRunTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<pd::testing::TempDir> dir = pd::testing::TempDir::Create("pd-loadtest-");
    ASSERT_TRUE(dir.ok()) << dir.status();
    dir_.emplace(*std::move(dir));
  }

  void StartServer(FakeGenerationServerOptions o = {}) {
    absl::StatusOr<std::unique_ptr<FakeGenerationServer>> s = FakeGenerationServer::Start(o);
    ASSERT_TRUE(s.ok()) << s.status();
    server_ = *std::move(s);
  }

  LoadTestConfig Config() {
    LoadTestConfig c;
    c.target = server_ != nullptr ? server_->address() : "127.0.0.1:1";
    c.progress = "off";
    c.output_json = dir_->File("out.json");
    c.output_csv = dir_->File("out.csv");
    return c;
  }

  LoadRunOutcome RunOk(const LoadTestConfig& c) {
    absl::StatusOr<std::unique_ptr<LoadRun>> lt = LoadRun::Create(c);
    EXPECT_TRUE(lt.ok()) << lt.status();
    if (!lt.ok()) {
      return {};
    }
    LoadRunOutcome out = (*lt)->Run();
    EXPECT_TRUE(out.report_status.ok()) << out.report_status;
    return out;
  }

  std::optional<pd::testing::TempDir> dir_;
  std::unique_ptr<FakeGenerationServer> server_;
};

TEST_F(LoadRunTest, SyntheticRunWritesJsonAndCsv) {
  FakeGenerationServerOptions so;
  so.vocab_size = 100;  // the prompt's token range comes from ListModels; the server checks it
  so.tokens_per_message = 2;
  StartServer(so);
  LoadTestConfig c = Config();
  c.concurrency = 8;
  c.num_requests = 50;
  c.input_len = "uniform:10,30";
  c.output_len = "5";
  c.slo_ttft_ms = 60'000;
  const LoadRunOutcome out = RunOk(c);
  EXPECT_EQ(out.summary.completed, 50);
  EXPECT_EQ(out.summary.failed, 0);
  EXPECT_EQ(out.info.model, "fake-model");
  EXPECT_THAT(out.table, HasSubstr("Successful requests:"));

  const nlohmann::json j = nlohmann::json::parse(ReadFile(c.output_json));
  EXPECT_EQ(j["completed"], 50);
  EXPECT_EQ(j["failed"], 0);
  EXPECT_EQ(j["total_output_tokens"], 250);
  EXPECT_EQ(j["num_ttft_samples"], 50);
  // 5 tokens in messages of 2, 2, 1: per request 2 ITL samples for the second message and 1
  // for the third (see metrics.h).
  EXPECT_EQ(j["num_itl_samples"], 150);
  EXPECT_EQ(j["good_requests"], 50);
  EXPECT_EQ(j["interrupted"], false);
  EXPECT_LE(j["max_in_flight"].get<int>(), 8);
  EXPECT_EQ(j["config"]["workload"], "synthetic");
  EXPECT_EQ(j["config"]["arrival"], "closed");
  EXPECT_EQ(j["config"]["vocab"], "[3,100)");
  EXPECT_EQ(j["config"]["input_len"], "uniform:10,30");
  EXPECT_TRUE(j["errors"].empty());
  EXPECT_DOUBLE_EQ(j["prefix_cache_hit_ratio"].get<double>(), 0.0);

  std::vector<std::string> lines = absl::StrSplit(ReadFile(c.output_csv), '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), 51u);
  EXPECT_THAT(lines[0], StartsWith("index,source_line,"));
  for (size_t i = 1; i < lines.size(); ++i) {
    std::vector<std::string> f = absl::StrSplit(lines[i], ',');
    ASSERT_EQ(f.size(), 16u) << lines[i];
    EXPECT_EQ(f[0], absl::StrCat(i - 1));
    EXPECT_EQ(f[9], "5");  // output_tokens
    EXPECT_EQ(f[13], "LENGTH");
    EXPECT_EQ(f[14], "OK");
  }
}

TEST_F(LoadRunTest, SharedPrefixReportsThePrefixCacheHitRatio) {
  FakeGenerationServerOptions so;
  so.simulate_prefix_cache = true;  // block_size 16
  StartServer(so);
  LoadTestConfig c = Config();
  c.workload = "shared_prefix";
  c.num_prefixes = 2;
  c.suffixes_per_prefix = 4;
  c.prefix_len = 64;  // 4 full blocks
  c.suffix_len = 8;   // a partial block: never cached
  c.output_len = "2";
  c.concurrency = 1;  // sequential, so the hit count is exact
  c.num_requests = 16;
  const LoadRunOutcome out = RunOk(c);
  EXPECT_EQ(out.summary.completed, 16);
  // Every request but the first of each prefix hits its 64 prefix tokens.
  EXPECT_EQ(out.summary.usage_prompt_tokens, 16 * 72);
  EXPECT_EQ(out.summary.usage_cached_tokens, 14 * 64);
  ASSERT_TRUE(out.summary.prefix_cache_hit_ratio.has_value());
  EXPECT_DOUBLE_EQ(*out.summary.prefix_cache_hit_ratio, 14.0 * 64 / (16 * 72));
}

// Two conversations of three turns, sequential: each turn hits the previous turn's prompt
// (not the synthesized reply, which the server never saw as a prompt), and the second
// conversation's first turn hits the shared system prompt.
TEST_F(LoadRunTest, MultiTurnHitsThePreviousTurn) {
  FakeGenerationServerOptions so;
  so.simulate_prefix_cache = true;  // block_size 16
  StartServer(so);
  LoadTestConfig c = Config();
  c.workload = "multi_turn";
  c.num_conversations = 2;
  c.num_turns = 3;
  c.system_prompt_len = 32;
  c.user_len = "16";
  c.output_len = "16";
  c.concurrency = 1;  // sequential, so the hit count is exact
  c.num_requests = 6;
  const LoadRunOutcome out = RunOk(c);
  EXPECT_EQ(out.summary.completed, 6);
  // Prompts 48, 48, 80, 80, 112, 112; hits 0, 32 (system), 48, 48, 80, 80.
  EXPECT_EQ(out.summary.usage_prompt_tokens, 480);
  EXPECT_EQ(out.summary.usage_cached_tokens, 288);
}

TEST_F(LoadRunTest, TraceReplayFromFile) {
  FakeGenerationServerOptions so;
  so.simulate_prefix_cache = true;
  StartServer(so);
  const std::string trace = dir_->File("t.jsonl");
  {
    std::ofstream f(trace);
    f << "{\"timestamp\": 0, \"input_length\": 1024, \"output_length\": 3, \"hash_ids\": [0, 1]}\n"
         "{\"timestamp\": 3000, \"input_length\": 1500, \"output_length\": 2, \"hash_ids\": [0, "
         "1, 2]}\n"
         "{\"timestamp\": 3000, \"input_length\": 9000, \"output_length\": 1, \"hash_ids\": ["
      << absl::StrJoin(
             std::vector<int>{0, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19}, ", ")
      << "]}\n";
  }
  LoadTestConfig c = Config();
  c.workload = "trace";
  c.trace = trace;
  c.time_scale = 0.001;
  c.max_input_len = 2048;
  c.concurrency = 1;  // a cap: requests 2 and 3 (same timestamp) reach the cache in order
  const LoadRunOutcome out = RunOk(c);
  EXPECT_EQ(out.summary.completed, 3);
  EXPECT_EQ(out.summary.total_input_tokens, 1024 + 1500 + 2048);  // the third one capped
  EXPECT_EQ(out.summary.total_output_tokens, 6);
  // Request 2 repeats request 1's two blocks (1024 tokens); request 3 shares block 0 (512).
  EXPECT_EQ(out.summary.usage_cached_tokens, 1024 + 512);
  const nlohmann::json j = nlohmann::json::parse(ReadFile(c.output_json));
  EXPECT_EQ(j["config"]["arrival"], "trace");
  EXPECT_EQ(j["config"]["trace_capped_requests"], "1");
  std::vector<std::string> lines = absl::StrSplit(ReadFile(c.output_csv), '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), 4u);
  EXPECT_THAT(lines[3], StartsWith("2,3,3.000,"));  // index 2, line 3, scheduled at 3 ms
}

TEST_F(LoadRunTest, FailuresAppearByCodeInTheReport) {
  FakeGenerationServerOptions so;
  so.fail_every_n = 4;
  so.fail_code = absl::StatusCode::kUnavailable;
  StartServer(so);
  LoadTestConfig c = Config();
  c.request_rate = 500;
  c.num_requests = 40;
  c.output_len = "3";
  c.input_len = "8";
  const LoadRunOutcome out = RunOk(c);
  EXPECT_EQ(out.summary.completed, 30);
  EXPECT_EQ(out.summary.failed, 10);
  const nlohmann::json j = nlohmann::json::parse(ReadFile(c.output_json));
  EXPECT_EQ(j["errors"]["UNAVAILABLE"], 10);
  EXPECT_EQ(j["config"]["arrival"], "poisson");
  std::vector<std::string> lines = absl::StrSplit(ReadFile(c.output_csv), '\n', absl::SkipEmpty());
  int unavailable = 0;
  for (const std::string& line : lines) {
    unavailable += absl::StrContains(line, ",UNAVAILABLE,\"injected failure\"") ? 1 : 0;
  }
  EXPECT_EQ(unavailable, 10);
}

TEST_F(LoadRunTest, UnreachableTargetIsAClearError) {
  absl::StatusOr<int> port = pd::testing::PickFreeLoopbackPort();
  ASSERT_TRUE(port.ok());
  LoadTestConfig c = Config();
  c.target = absl::StrCat("127.0.0.1:", *port);
  c.concurrency = 1;
  c.num_requests = 1;
  c.connect_timeout = absl::Milliseconds(500);
  absl::StatusOr<std::unique_ptr<LoadRun>> lt = LoadRun::Create(c);
  ASSERT_FALSE(lt.ok());
  EXPECT_EQ(lt.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(lt.status().message()),
              HasSubstr(absl::StrCat("cannot connect to target 127.0.0.1:", *port)));
}

TEST_F(LoadRunTest, UnknownModelAndTooLargeVocabulary) {
  StartServer();
  LoadTestConfig c = Config();
  c.concurrency = 1;
  c.num_requests = 1;
  c.model = "llama-9000";
  absl::StatusOr<std::unique_ptr<LoadRun>> lt = LoadRun::Create(c);
  EXPECT_EQ(lt.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(lt.status().message()), HasSubstr("it serves: fake-model"));
  c.model = "";
  c.vocab_size = 64000;
  lt = LoadRun::Create(c);
  EXPECT_EQ(lt.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(lt.status().message()), HasSubstr("exceeds model 'fake-model'"));
}

TEST_F(LoadRunTest, MalformedTraceFailsBeforeConnecting) {
  const std::string trace = dir_->File("bad.jsonl");
  {
    std::ofstream f(trace);
    f << "{\"timestamp\": 0, \"input_length\": 10, \"output_length\": 3, \"hash_ids\": [0]}\n"
         "{\"timestamp\": 1, \"input_length\": 10}\n";
  }
  LoadTestConfig c = Config();  // no server: the trace is checked first
  c.workload = "trace";
  c.trace = trace;
  absl::StatusOr<std::unique_ptr<LoadRun>> lt = LoadRun::Create(c);
  ASSERT_FALSE(lt.ok());
  EXPECT_EQ(lt.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(lt.status().message()),
              HasSubstr(trace + ":2: missing field 'output_length'"));
}

// Compare mode against two canned-token servers: B answers 50 ms late and slower, and only A
// reports prefix-cache hits (a stand-in for a cache-aware router against round-robin).
TEST_F(LoadRunTest, CompareModeSendsEveryRequestToBothAndReportsRatios) {
  FakeGenerationServerOptions ao;
  ao.simulate_prefix_cache = true;
  StartServer(ao);
  FakeGenerationServerOptions bo;
  bo.first_token_delay = absl::Milliseconds(50);
  bo.token_delay = absl::Milliseconds(5);
  absl::StatusOr<std::unique_ptr<FakeGenerationServer>> b = FakeGenerationServer::Start(bo);
  ASSERT_TRUE(b.ok()) << b.status();

  LoadTestConfig c = Config();
  c.compare_target = (*b)->address();
  c.output_csv = "";
  c.output_dir = dir_->File("cmp");
  c.gnuplot = "";  // scripts only; rendering is PlotTest's
  c.workload = "shared_prefix";
  c.num_prefixes = 2;
  c.suffixes_per_prefix = 4;
  c.prefix_len = 64;
  c.suffix_len = 8;
  c.output_len = "4";
  c.concurrency = 2;
  c.num_requests = 16;
  const LoadRunOutcome out = RunOk(c);
  ASSERT_EQ(out.runs.size(), 2u);
  EXPECT_EQ(out.runs[0].summary.completed, 16);
  EXPECT_EQ(out.runs[1].summary.completed, 16);
  EXPECT_EQ(out.runs[1].info.target, (*b)->address());
  EXPECT_EQ(server_->stats().requests, 16);
  EXPECT_EQ((*b)->stats().requests, 16);
  // The same requests on both sides, in workload order.
  for (size_t i = 0; i < 16; ++i) {
    EXPECT_EQ(out.runs[0].records[i].index, static_cast<int64_t>(i));
    EXPECT_EQ(out.runs[1].records[i].index, static_cast<int64_t>(i));
    EXPECT_EQ(out.runs[1].records[i].target, 1);
    EXPECT_EQ(out.runs[0].records[i].input_tokens, out.runs[1].records[i].input_tokens);
  }
  EXPECT_THAT(out.table, HasSubstr("pd-loadtest compare (B / A)"));

  const nlohmann::json j = nlohmann::json::parse(ReadFile(c.output_json));
  EXPECT_EQ(j, nlohmann::json::parse(ReadFile(dir_->File("cmp/summary.json"))));
  EXPECT_EQ(j["mode"], "compare");
  EXPECT_EQ(j["a"]["completed"], 16);
  EXPECT_EQ(j["b"]["config"]["target"], (*b)->address());
  EXPECT_GT(j["ratios"]["mean_ttft_ms"].get<double>(), 1.0);
  EXPECT_GT(j["ratios"]["median_ttft_ms"].get<double>(), 1.0);
  EXPECT_GT(j["ratios"]["mean_e2el_ms"].get<double>(), 1.0);
  EXPECT_GT(j["a"]["prefix_cache_hit_ratio"].get<double>(), 0.0);
  EXPECT_DOUBLE_EQ(j["ratios"]["prefix_cache_hit_ratio"].get<double>(), 0.0);
  for (const char* f : {"records_a.csv", "records_b.csv"}) {
    std::vector<std::string> lines =
        absl::StrSplit(ReadFile(dir_->File(absl::StrCat("cmp/", f))), '\n', absl::SkipEmpty());
    EXPECT_EQ(lines.size(), 17u) << f;
  }
  EXPECT_THAT(ReadFile(dir_->File("cmp/latency_cdf.gp")), HasSubstr("\"cdf_b_ttft.dat\""));
}

TEST_F(LoadRunTest, RateSweepRunsEachRateWithItsOwnSummary) {
  StartServer();
  LoadTestConfig c = Config();
  c.output_csv = "";
  c.output_dir = dir_->File("sweep");
  c.gnuplot = "";
  c.request_rates = "200,400";
  c.num_requests = 20;
  c.input_len = "8";
  c.output_len = "3";
  c.slo_ttft_ms = 60'000;
  const LoadRunOutcome out = RunOk(c);
  ASSERT_EQ(out.runs.size(), 2u);
  EXPECT_EQ(out.runs[0].summary.completed, 20);
  EXPECT_EQ(out.runs[1].summary.completed, 20);
  EXPECT_EQ(out.runs[1].info.request_rate, 400);
  EXPECT_EQ(server_->stats().requests, 40);
  // The same requests at each rate (a fresh copy of the seeded workload).
  for (size_t i = 0; i < 20; ++i) {
    EXPECT_EQ(out.runs[0].records[i].input_tokens, out.runs[1].records[i].input_tokens);
  }
  EXPECT_THAT(out.table, HasSubstr("pd-loadtest sweep"));
  const nlohmann::json j = nlohmann::json::parse(ReadFile(c.output_json));
  EXPECT_EQ(j["mode"], "sweep");
  EXPECT_EQ(j["request_rates"], nlohmann::json::parse("[200.0, 400.0]"));
  ASSERT_EQ(j["runs"].size(), 2u);
  EXPECT_EQ(j["runs"][1]["config"]["request_rate"], 400.0);
  EXPECT_EQ(j["runs"][1]["good_requests"], 20);
  std::vector<std::string> data =
      absl::StrSplit(ReadFile(dir_->File("sweep/throughput.dat")), '\n', absl::SkipEmpty());
  ASSERT_EQ(data.size(), 4u);  // two comment lines, two rates
  EXPECT_THAT(data[2], StartsWith("200 "));
  EXPECT_THAT(data[3], StartsWith("400 "));
  for (const char* f : {"records_rate_200.csv", "records_rate_400.csv", "latency_cdf.gp",
                        "throughput.gp", "cdf_rate_400_itl.dat"}) {
    EXPECT_FALSE(ReadFile(dir_->File(absl::StrCat("sweep/", f))).empty()) << f;
  }
  ASSERT_TRUE(out.plots.has_value());
  EXPECT_TRUE(out.plots->images.empty());
}

// A compared sweep: at each rate both targets get the same requests interleaved; the report
// has a (A, B) pair per rate, a ratio table per rate, one sweep table and one throughput
// series per target.
TEST_F(LoadRunTest, CompareModeWithARateSweep) {
  FakeGenerationServerOptions ao;
  ao.simulate_prefix_cache = true;
  StartServer(ao);
  FakeGenerationServerOptions bo;
  bo.first_token_delay = absl::Milliseconds(20);
  absl::StatusOr<std::unique_ptr<FakeGenerationServer>> b = FakeGenerationServer::Start(bo);
  ASSERT_TRUE(b.ok()) << b.status();
  LoadTestConfig c = Config();
  c.compare_target = (*b)->address();
  c.output_csv = "";
  c.output_dir = dir_->File("cmpsweep");
  c.gnuplot = "";
  c.request_rates = "200,400";
  c.workload = "shared_prefix";
  c.num_prefixes = 2;
  c.suffixes_per_prefix = 2;
  c.prefix_len = 32;
  c.suffix_len = 0;
  c.output_len = "2";
  c.num_requests = 10;
  const LoadRunOutcome out = RunOk(c);
  ASSERT_EQ(out.runs.size(), 4u);
  EXPECT_EQ(server_->stats().requests, 20);
  EXPECT_EQ((*b)->stats().requests, 20);
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(out.runs[i].summary.completed, 10) << i;
    EXPECT_EQ(out.runs[i].info.request_rate, i < 2 ? 200 : 400) << i;
    EXPECT_EQ(out.runs[i].info.target, i % 2 == 0 ? c.target : (*b)->address()) << i;
  }
  EXPECT_EQ(out.runs[2].label, "A rate=400");
  EXPECT_THAT(out.table, HasSubstr("rate 400 req/s:\n============ pd-loadtest compare (B / A)"));
  EXPECT_THAT(out.table, HasSubstr(absl::StrCat("B = ", (*b)->address(), "\n====")));
  const nlohmann::json j = nlohmann::json::parse(ReadFile(dir_->File("cmpsweep/summary.json")));
  EXPECT_EQ(j["mode"], "compare_sweep");
  EXPECT_EQ(j["request_rates"], nlohmann::json::parse("[200.0, 400.0]"));
  ASSERT_EQ(j["a"].size(), 2u);
  ASSERT_EQ(j["ratios"].size(), 2u);
  EXPECT_EQ(j["b"][1]["config"]["target"], (*b)->address());
  EXPECT_GT(j["ratios"][1]["mean_ttft_ms"].get<double>(), 1.0);  // B answers 20 ms late
  for (const char* f : {"records_a_rate_200.csv", "records_b_rate_400.csv", "throughput_a.dat",
                        "throughput_b.dat", "cdf_b_rate_400_ttft.dat"}) {
    EXPECT_FALSE(ReadFile(dir_->File(absl::StrCat("cmpsweep/", f))).empty()) << f;
  }
  const std::string tp = ReadFile(dir_->File("cmpsweep/throughput.gp"));
  EXPECT_THAT(tp, HasSubstr(absl::StrCat("title \"B ", (*b)->address(), " throughput\"")));
}

TEST_F(LoadRunTest, StopBeforeASweepRunsNothingMore) {
  StartServer();
  LoadTestConfig c = Config();
  c.output_csv = "";
  c.request_rates = "100,200,400";
  c.num_requests = 10;
  absl::StatusOr<std::unique_ptr<LoadRun>> lt = LoadRun::Create(c);
  ASSERT_TRUE(lt.ok()) << lt.status();
  (*lt)->Stop();
  const LoadRunOutcome out = (*lt)->Run();
  ASSERT_EQ(out.runs.size(), 1u);  // the first rate, stopped before its first request
  EXPECT_TRUE(out.runs[0].info.interrupted);
  EXPECT_EQ(out.runs[0].summary.num_requests, 0);
  EXPECT_EQ(server_->stats().requests, 0);
  const nlohmann::json j = nlohmann::json::parse(ReadFile(c.output_json));
  EXPECT_EQ(j["runs"][0]["interrupted"], true);
}

TEST_F(LoadRunTest, UnreachableCompareTargetIsAClearError) {
  StartServer();
  absl::StatusOr<int> port = pd::testing::PickFreeLoopbackPort();
  ASSERT_TRUE(port.ok());
  LoadTestConfig c = Config();
  c.output_csv = "";
  c.compare_target = absl::StrCat("127.0.0.1:", *port);
  c.concurrency = 1;
  c.num_requests = 1;
  c.connect_timeout = absl::Milliseconds(500);
  absl::StatusOr<std::unique_ptr<LoadRun>> lt = LoadRun::Create(c);
  ASSERT_FALSE(lt.ok());
  EXPECT_EQ(lt.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(lt.status().message()), HasSubstr(c.compare_target));
}

}  // namespace
}  // namespace pd::loadtest
