#include "loadtest/plot.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "common/testing/temp_dir.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pd::loadtest {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;
using ::testing::Pair;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// n successful requests with TTFT i ms and two ITL gaps each; one failed request.
std::vector<RequestRecord> Records(int n) {
  std::vector<RequestRecord> out;
  for (int i = 1; i <= n; ++i) {
    RequestRecord r;
    r.index = i;
    r.start_ns = 0;
    r.first_token_ns = i * 1'000'000;
    r.end_ns = r.first_token_ns + 4'000'000;
    r.output_tokens = 3;
    r.itl_ns = {2'000'000, 2'000'000};
    out.push_back(r);
  }
  RequestRecord failed;
  failed.code = absl::StatusCode::kUnavailable;
  out.push_back(failed);
  return out;
}

// gnuplot is optional at run time: the rendering checks run only where it is installed.
bool HaveGnuplot() {
  return ::access("/usr/bin/gnuplot", X_OK) == 0 || ::access("/usr/local/bin/gnuplot", X_OK) == 0;
}

TEST(PlotTest, CdfPointsKeepEverySampleOrSpreadRanks) {
  EXPECT_THAT(CdfPoints({}, 10), IsEmpty());
  EXPECT_THAT(CdfPoints({3, 1, 2}, 10),
              ElementsAre(Pair(1, 1.0 / 3), Pair(2, 2.0 / 3), Pair(3, 1)));
  std::vector<double> many;
  for (int i = 0; i < 1000; ++i) {
    many.push_back(999 - i);
  }
  const std::vector<std::pair<double, double>> p = CdfPoints(many, 11);
  ASSERT_EQ(p.size(), 11u);
  EXPECT_EQ(p.front(), std::make_pair(0.0, 0.001));  // the smallest sample
  EXPECT_EQ(p.back(), std::make_pair(999.0, 1.0));   // the largest
  EXPECT_EQ(p[5].first, 500);                        // rank round(5 * 999 / 10) = 500
}

TEST(PlotTest, LatencySamplesFollowTheSummaryDefinitions) {
  const std::vector<RequestRecord> records = Records(3);
  EXPECT_THAT(LatencySamples(records, LatencyMetric::kTtft), ElementsAre(1, 2, 3));
  EXPECT_THAT(LatencySamples(records, LatencyMetric::kTpot), ElementsAre(2, 2, 2));
  EXPECT_EQ(LatencySamples(records, LatencyMetric::kItl).size(), 6u);
  EXPECT_THAT(LatencySamples(records, LatencyMetric::kE2el), ElementsAre(5, 6, 7));
}

TEST(PlotTest, WritesScriptsThatReferenceTheirDataColumns) {
  absl::StatusOr<pd::testing::TempDir> dir = pd::testing::TempDir::Create("pd-plot-");
  ASSERT_TRUE(dir.ok()) << dir.status();
  const std::vector<RequestRecord> a = Records(50);
  std::vector<RequestRecord> b = Records(20);
  for (RequestRecord& r : b) {
    r.output_tokens = 1;  // no TPOT and no ITL samples in run b
    r.itl_ns.clear();
  }
  std::vector<SweepPoint> sweep(2);
  sweep[0] = {1, 0.98, 98, std::nullopt, 12, 30};
  sweep[1] = {2, 1.9, 190, std::nullopt, 15, 40};
  absl::StatusOr<PlotFiles> files =
      WritePlots(dir->path(), {{"A x", "a", &a}, {"B \"y\"", "b", &b}}, {{"", "", sweep}}, "");
  ASSERT_TRUE(files.ok()) << files.status();
  EXPECT_EQ(files->data.size(), 8u + 1u);
  EXPECT_THAT(files->images, IsEmpty());
  EXPECT_THAT(files->note, HasSubstr("scripts kept"));
  for (const std::string& f : files->data) {
    EXPECT_TRUE(std::filesystem::exists(f)) << f;
  }
  const std::string ttft = ReadFile(dir->File("cdf_a_ttft.dat"));
  EXPECT_THAT(ttft, HasSubstr("# columns: 1 = ttft_ms, 2 = cumulative_fraction"));
  EXPECT_THAT(ttft, HasSubstr("\n1 0.02\n"));  // the smallest of 50 samples

  const std::string cdf = ReadFile(dir->File("latency_cdf.gp"));
  EXPECT_THAT(cdf, HasSubstr("set output \"latency_cdf.png\""));
  for (const char* metric : {"ttft", "tpot", "itl", "e2el"}) {
    EXPECT_THAT(cdf, HasSubstr(absl::StrCat("\"cdf_a_", metric, ".dat\" using 1:2")));
  }
  EXPECT_THAT(cdf, HasSubstr("\"cdf_b_ttft.dat\" using 1:2"));
  EXPECT_THAT(cdf, Not(HasSubstr("cdf_b_tpot.dat")));    // no samples: left out
  EXPECT_THAT(cdf, HasSubstr("title \"B \\\"y\\\"\""));  // quotes escaped

  const std::string tp = ReadFile(dir->File("throughput.gp"));
  EXPECT_THAT(tp, HasSubstr("\"throughput.dat\" using 1:2"));
  EXPECT_THAT(tp, HasSubstr("\"throughput.dat\" using 1:3"));
  EXPECT_THAT(tp, Not(HasSubstr("using 1:4")));  // no SLO, no goodput line
  const std::string data = ReadFile(dir->File("throughput.dat"));
  EXPECT_THAT(data, HasSubstr("\n1 0.98 98 NaN 12 30\n2 1.9 190 NaN 15 40\n"));
  EXPECT_THAT(ThroughputScript({{"", "", {}}}, true), HasSubstr("\"throughput.dat\" using 1:4"));
}

// A compared sweep: one data file and one set of lines per target, titled by its label.
TEST(PlotTest, TwoSweepSeriesGetTheirOwnDataAndLines) {
  absl::StatusOr<pd::testing::TempDir> dir = pd::testing::TempDir::Create("pd-plot-");
  ASSERT_TRUE(dir.ok()) << dir.status();
  std::vector<SweepSeries> sweep = {
      {"A x:1", "a", {{1, 1, 10, 0.5, 3, 4}, {2, 2, 20, 1.5, 3, 5}}},
      {"B y:2", "b", {{1, 0.9, 9, 0.4, 6, 8}, {2, 1.2, 12, 0.2, 9, 30}}}};
  absl::StatusOr<PlotFiles> files = WritePlots(dir->path(), {}, sweep, "");
  ASSERT_TRUE(files.ok()) << files.status();
  EXPECT_EQ(files->data.size(), 2u);
  EXPECT_THAT(ReadFile(dir->File("throughput_a.dat")), HasSubstr("\n1 1 10 0.5 3 4\n"));
  EXPECT_THAT(ReadFile(dir->File("throughput_b.dat")), HasSubstr("\n2 1.2 12 0.2 9 30\n"));
  EXPECT_FALSE(std::filesystem::exists(dir->File("throughput.dat")));
  const std::string tp = ReadFile(dir->File("throughput.gp"));
  for (const char* line :
       {"\"throughput_a.dat\" using 1:2 with linespoints lw 2 pt 7 title \"A x:1 throughput\"",
        "\"throughput_b.dat\" using 1:4 with linespoints lw 2 pt 5 title \"B y:2 goodput\"",
        "\"throughput_b.dat\" using 1:3", "\"throughput_a.dat\" using 1:6"}) {
    EXPECT_THAT(tp, HasSubstr(line));
  }
}

TEST(PlotTest, MissingGnuplotKeepsTheScripts) {
  absl::StatusOr<pd::testing::TempDir> dir = pd::testing::TempDir::Create("pd-plot-");
  ASSERT_TRUE(dir.ok()) << dir.status();
  const std::vector<RequestRecord> a = Records(5);
  absl::StatusOr<PlotFiles> files =
      WritePlots(dir->path(), {{"run", "run", &a}}, {}, "pd-no-such-gnuplot-program");
  ASSERT_TRUE(files.ok()) << files.status();
  EXPECT_THAT(files->images, IsEmpty());
  EXPECT_THAT(files->note, HasSubstr("not found"));
  EXPECT_TRUE(std::filesystem::exists(dir->File("latency_cdf.gp")));
}

TEST(PlotTest, GnuplotRendersTheImagesWhenInstalled) {
  if (!HaveGnuplot()) {
    GTEST_SKIP() << "gnuplot is not installed (scripts/setup.sh installs gnuplot-nox)";
  }
  absl::StatusOr<pd::testing::TempDir> dir = pd::testing::TempDir::Create("pd-plot-");
  ASSERT_TRUE(dir.ok()) << dir.status();
  const std::vector<RequestRecord> a = Records(40);
  std::vector<RequestRecord> b = Records(10);
  for (RequestRecord& r : b) {
    r.output_tokens = 1;
    r.itl_ns.clear();
  }
  std::vector<SweepSeries> sweep = {{"A", "a", {{1, 1, 10, 0.5, 3, 4}, {2, 2, 20, 1.5, 3, 5}}},
                                    {"B", "b", {{1, 1, 9, 0.5, 6, 8}, {2, 1.5, 15, 0.2, 9, 30}}}};
  absl::StatusOr<PlotFiles> files =
      WritePlots(dir->path(), {{"a", "a", &a}, {"b", "b", &b}}, sweep, "gnuplot");
  ASSERT_TRUE(files.ok()) << files.status();
  EXPECT_EQ(files->note, "") << ReadFile(dir->File("gnuplot.log"));
  ASSERT_EQ(files->images.size(), 2u);
  for (const std::string& image : files->images) {
    EXPECT_GT(std::filesystem::file_size(image), 1000u) << image;
  }
}

}  // namespace
}  // namespace pd::loadtest
