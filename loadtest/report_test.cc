#include "loadtest/report.h"

#include <nlohmann/json.hpp>

#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pd::loadtest {
namespace {

using ::testing::ContainsRegex;
using ::testing::HasSubstr;

std::vector<RequestRecord> TwoRecords() {
  RequestRecord ok;
  ok.index = 0;
  ok.start_ns = 1'000'000;
  ok.first_token_ns = 3'000'000;
  ok.end_ns = 7'000'000;
  ok.input_tokens = 10;
  ok.max_tokens = 3;
  ok.output_tokens = 3;
  ok.has_usage = true;
  ok.prompt_tokens = 10;
  ok.cached_tokens = 0;
  ok.completion_tokens = 3;
  ok.finish_reason = "LENGTH";
  ok.itl_ns = {2'000'000, 2'000'000};
  RequestRecord bad;
  bad.index = 1;
  bad.code = absl::StatusCode::kUnavailable;
  bad.error = "worker \"w1\" died,\nretry";
  bad.end_ns = 2'000'000;
  return {ok, bad};
}

TEST(ReportTest, JsonHasVllmNamesAndTheConfig) {
  Slo slo;
  slo.ttft_ms = 5;
  const Summary s = Summarize(TwoRecords(), 1'000'000'000, slo);
  RunInfo info;
  info.target = "127.0.0.1:1";
  info.workload = "synthetic";
  info.arrival = "closed";
  info.concurrency = 4;
  info.max_in_flight = 2;
  info.workload_options = {{"input_len", "10"}};
  const nlohmann::json j = nlohmann::json::parse(SummaryJson(s, info));
  EXPECT_EQ(j["completed"], 1);
  EXPECT_EQ(j["failed"], 1);
  EXPECT_EQ(j["interrupted"], false);
  EXPECT_DOUBLE_EQ(j["duration"].get<double>(), 1.0);
  EXPECT_DOUBLE_EQ(j["request_throughput"].get<double>(), 1.0);
  EXPECT_DOUBLE_EQ(j["output_throughput"].get<double>(), 3.0);
  EXPECT_DOUBLE_EQ(j["mean_ttft_ms"].get<double>(), 2.0);
  EXPECT_DOUBLE_EQ(j["mean_tpot_ms"].get<double>(), 2.0);
  EXPECT_DOUBLE_EQ(j["p99_itl_ms"].get<double>(), 2.0);
  EXPECT_DOUBLE_EQ(j["median_e2el_ms"].get<double>(), 6.0);
  for (const char* key : {"p90_ttft_ms", "p95_tpot_ms", "num_itl_samples", "total_input_tokens",
                          "total_token_throughput", "usage_cached_tokens", "short_outputs"}) {
    EXPECT_TRUE(j.contains(key)) << key;
  }
  EXPECT_EQ(j["request_goodput"], 1.0);
  EXPECT_EQ(j["errors"]["UNAVAILABLE"], 1);
  EXPECT_DOUBLE_EQ(j["prefix_cache_hit_ratio"].get<double>(), 0.0);
  EXPECT_EQ(j["max_in_flight"], 2);
  EXPECT_EQ(j["config"]["target"], "127.0.0.1:1");
  EXPECT_EQ(j["config"]["concurrency"], 4);
  EXPECT_EQ(j["config"]["input_len"], "10");
  EXPECT_EQ(j["config"]["slo_ttft_ms"], 5.0);
  EXPECT_TRUE(j["config"]["slo_tpot_ms"].is_null());
}

TEST(ReportTest, JsonWithoutSloOrUsageHasNulls) {
  const Summary s = Summarize({}, 0, Slo{});
  const nlohmann::json j = nlohmann::json::parse(SummaryJson(s, RunInfo{}));
  EXPECT_TRUE(j["request_goodput"].is_null());
  EXPECT_TRUE(j["prefix_cache_hit_ratio"].is_null());
}

TEST(ReportTest, CsvOneRowPerRecordWithQuotedErrors) {
  const std::string csv = RecordsCsv(TwoRecords());
  std::vector<std::string> lines = absl::StrSplit(csv, '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(lines[0],
            "index,source_line,scheduled_ms,start_ms,ttft_ms,tpot_ms,e2el_ms,input_tokens,"
            "max_tokens,output_tokens,prompt_tokens,cached_tokens,completion_tokens,"
            "finish_reason,status,error");
  EXPECT_EQ(lines[1], "0,0,0.000,1.000,2.000,2.000,6.000,10,3,3,10,0,3,LENGTH,OK,");
  EXPECT_EQ(lines[2],
            "1,0,0.000,0.000,,,2.000,0,0,0,,,,,UNAVAILABLE,\"worker \"\"w1\"\" died, retry\"");
}

TEST(ReportTest, TableShowsTheFigures) {
  const Summary s = Summarize(TwoRecords(), 1'000'000'000, Slo{});
  RunInfo info;
  info.interrupted = true;
  const std::string t = SummaryTable(s, info);
  EXPECT_THAT(t, HasSubstr("INTERRUPTED"));
  EXPECT_THAT(t, ContainsRegex("Successful requests: +1\n"));
  EXPECT_THAT(t, HasSubstr("UNAVAILABLE:"));
  EXPECT_THAT(t, HasSubstr("TTFT"));
  EXPECT_THAT(t, HasSubstr("Prefix cache hit ratio:"));
}

}  // namespace
}  // namespace pd::loadtest
