#include "loadtest/report.h"

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
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

TEST(ReportTest, CompareRatiosAreBOverA) {
  Summary a;
  a.request_throughput = 10;
  a.ttft = {5, 20, 18, 30, 35, 50};
  a.tpot = {5, 2, 2, 2, 2, 2};
  a.prefix_cache_hit_ratio = 0.5;
  a.completed = 5;
  Summary b = a;
  b.request_throughput = 5;
  b.ttft.mean = 40;
  b.prefix_cache_hit_ratio = 0.25;
  b.tpot.count = 0;  // undefined on one side: no ratio
  const std::vector<MetricRatio> m = CompareMetrics(a, b);
  auto find = [&m](const std::string& name) {
    for (const MetricRatio& r : m) {
      if (r.name == name) {
        return r;
      }
    }
    ADD_FAILURE() << "no metric " << name;
    return MetricRatio{};
  };
  EXPECT_DOUBLE_EQ(*find("request_throughput").ratio, 0.5);
  EXPECT_TRUE(find("request_throughput").higher_is_better);
  EXPECT_DOUBLE_EQ(*find("mean_ttft_ms").ratio, 2.0);
  EXPECT_FALSE(find("mean_ttft_ms").higher_is_better);
  EXPECT_DOUBLE_EQ(*find("prefix_cache_hit_ratio").ratio, 0.5);
  EXPECT_FALSE(find("mean_tpot_ms").ratio.has_value());
  EXPECT_FALSE(find("failed").ratio.has_value());  // 0 / 0

  RunInfo ia;
  ia.target = "host-a:1";
  RunInfo ib;
  ib.target = "host-b:2";
  const nlohmann::json j = nlohmann::json::parse(CompareJson({"A", a, ia}, {"B", b, ib}));
  EXPECT_EQ(j["mode"], "compare");
  EXPECT_EQ(j["a"]["config"]["target"], "host-a:1");
  EXPECT_EQ(j["b"]["config"]["target"], "host-b:2");
  EXPECT_DOUBLE_EQ(j["ratios"]["mean_ttft_ms"].get<double>(), 2.0);
  EXPECT_TRUE(j["ratios"]["mean_tpot_ms"].is_null());
  const std::string table = CompareTable({"A", a, ia}, {"B", b, ib});
  EXPECT_THAT(table, HasSubstr("A = host-a:1, B = host-b:2"));
  EXPECT_THAT(table, ContainsRegex("mean_ttft_ms +20.000 +40.000 +2.000  A"));
  EXPECT_THAT(table, ContainsRegex("request_throughput +10.000 +5.000 +0.500  A"));
}

TEST(ReportTest, SweepJsonHasOneSummaryPerRate) {
  std::vector<LabeledSummary> runs(3);
  for (int i = 0; i < 3; ++i) {
    runs[i].label = absl::StrCat("rate=", 1 << i);
    runs[i].info.request_rate = 1 << i;
    runs[i].summary.request_throughput = 0.9 * (1 << i);
  }
  const nlohmann::json j = nlohmann::json::parse(SweepJson(runs));
  EXPECT_EQ(j["mode"], "sweep");
  EXPECT_EQ(j["request_rates"], nlohmann::json::parse("[1.0, 2.0, 4.0]"));
  ASSERT_EQ(j["runs"].size(), 3u);
  EXPECT_DOUBLE_EQ(j["runs"][2]["request_throughput"].get<double>(), 3.6);
  EXPECT_DOUBLE_EQ(j["runs"][2]["config"]["request_rate"].get<double>(), 4.0);
  EXPECT_THAT(SweepTable(runs), ContainsRegex("4.00 +3.60"));
}

}  // namespace
}  // namespace pd::loadtest
