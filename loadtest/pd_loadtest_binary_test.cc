// The pd-loadtest binary as a child process against the in-process fake Generation server:
// flag spellings, --help, exit statuses, and the partial report on SIGINT.
#include <signal.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/testing/net.h"
#include "common/testing/subprocess.h"
#include "common/testing/temp_dir.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "loadtest/testing/fake_generation_server.h"

namespace pd::loadtest {
namespace {

using ::pd::testing::ExitInfo;
using ::pd::testing::Subprocess;
using testing::FakeGenerationServer;
using testing::FakeGenerationServerOptions;
using ::testing::HasSubstr;

constexpr char kBinary[] = PD_BINARY_DIR "/loadtest/pd-loadtest";

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

class PdLoadtestBinaryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<pd::testing::TempDir> dir = pd::testing::TempDir::Create("pd-loadtest-bin-");
    ASSERT_TRUE(dir.ok()) << dir.status();
    dir_.emplace(*std::move(dir));
  }

  void StartServer(FakeGenerationServerOptions o = {}) {
    absl::StatusOr<std::unique_ptr<FakeGenerationServer>> s = FakeGenerationServer::Start(o);
    ASSERT_TRUE(s.ok()) << s.status();
    server_ = *std::move(s);
  }

  // Runs pd-loadtest with `args` to completion (60 s bound); returns its exit and output.
  ExitInfo Run(std::vector<std::string> args, std::string* output) {
    args.insert(args.begin(), kBinary);
    absl::StatusOr<Subprocess> p =
        Subprocess::Spawn(args, dir_->File(absl::StrCat("run", ++runs_, ".log")));
    EXPECT_TRUE(p.ok()) << p.status();
    if (!p.ok()) {
      return {};
    }
    absl::StatusOr<ExitInfo> exit = p->Wait(absl::Seconds(60));
    EXPECT_TRUE(exit.ok()) << exit.status() << "\n" << p->LogTail();
    *output = p->ReadLog();
    return exit.value_or(ExitInfo{});
  }

  std::optional<pd::testing::TempDir> dir_;
  std::unique_ptr<FakeGenerationServer> server_;
  int runs_ = 0;
};

TEST_F(PdLoadtestBinaryTest, HelpListsTheFlags) {
  std::string out;
  Run({"--help"}, &out);
  for (const char* flag : {"--workload", "--slo_ttft_ms", "--request_rate", "--burstiness",
                           "--time_scale", "--on_bad_line", "--output_json", "--output_csv",
                           "--request_rates", "--compare_target", "--output_dir", "--plot"}) {
    EXPECT_THAT(out, HasSubstr(flag));
  }
}

TEST_F(PdLoadtestBinaryTest, DashedFlagsRunAndWriteReports) {
  StartServer();
  const std::string json = dir_->File("r.json");
  const std::string csv = dir_->File("r.csv");
  std::string out;
  const ExitInfo exit =
      Run({absl::StrCat("--target=", server_->address()), "--concurrency=4", "--num-requests=20",
           "--input-len=uniform:4,12", "--output-len=3", "--slo-ttft-ms=60000", "--output-json",
           json, absl::StrCat("--output-csv=", csv), "--progress=lines"},
          &out);
  ASSERT_TRUE(exit.Success()) << exit.ToString() << "\n" << out;
  EXPECT_THAT(out, HasSubstr("Successful requests:"));
  EXPECT_THAT(out, HasSubstr("TTFT"));
  const nlohmann::json j = nlohmann::json::parse(ReadFile(json));
  EXPECT_EQ(j["completed"], 20);
  EXPECT_EQ(j["good_requests"], 20);
  EXPECT_EQ(j["config"]["slo_ttft_ms"], 60000.0);
  std::vector<std::string> lines = absl::StrSplit(ReadFile(csv), '\n', absl::SkipEmpty());
  EXPECT_EQ(lines.size(), 21u);
}

TEST_F(PdLoadtestBinaryTest, SweepWithOutputDirWritesOneSummaryPerRate) {
  StartServer();
  const std::string out_dir = dir_->File("sweep");
  std::string out;
  const ExitInfo exit =
      Run({absl::StrCat("--target=", server_->address()), "--request-rates=300,600",
           "--num-requests=15", "--input-len=8", "--output-len=2", "--progress=off",
           absl::StrCat("--output-dir=", out_dir), "--gnuplot="},
          &out);
  ASSERT_TRUE(exit.Success()) << exit.ToString() << "\n" << out;
  EXPECT_THAT(out, HasSubstr("pd-loadtest sweep"));
  EXPECT_THAT(out, HasSubstr(absl::StrCat("Plots: scripts and data in ", out_dir)));
  const nlohmann::json j = nlohmann::json::parse(ReadFile(out_dir + "/summary.json"));
  EXPECT_EQ(j["mode"], "sweep");
  ASSERT_EQ(j["runs"].size(), 2u);
  EXPECT_EQ(j["runs"][0]["completed"], 15);
  EXPECT_EQ(j["runs"][1]["completed"], 15);
}

TEST_F(PdLoadtestBinaryTest, BadFlagsAndUnreachableTargetExitNonZero) {
  std::string out;
  ExitInfo exit = Run({"--concurrency=1"}, &out);  // no bound
  EXPECT_TRUE(exit.exited && exit.code == 1) << exit.ToString();
  EXPECT_THAT(out, HasSubstr("pd-loadtest: error: the run needs a bound"));

  absl::StatusOr<int> port = pd::testing::PickFreeLoopbackPort();
  ASSERT_TRUE(port.ok());
  exit = Run({absl::StrCat("--target=127.0.0.1:", *port), "--concurrency=1", "--num_requests=1",
              "--connect_timeout=500ms"},
             &out);
  EXPECT_TRUE(exit.exited && exit.code == 1) << exit.ToString();
  EXPECT_THAT(out, HasSubstr(absl::StrCat("pd-loadtest: error: cannot connect to target "
                                          "127.0.0.1:",
                                          *port)));
  EXPECT_THAT(out, HasSubstr("(UNAVAILABLE)"));
}

TEST_F(PdLoadtestBinaryTest, MalformedTraceLineIsReportedWithItsNumber) {
  const std::string trace = dir_->File("t.jsonl");
  {
    std::ofstream f(trace);
    f << "{\"timestamp\": 0, \"input_length\": 10, \"output_length\": 3, \"hash_ids\": [0]}\n"
         "{\"timestamp\": 0, \"input_length\": 10, \"output_length\": 3, \"hash_ids\": [0]}\n"
         "not json\n";
  }
  std::string out;
  ExitInfo exit = Run({"--workload=trace", absl::StrCat("--trace=", trace)}, &out);
  EXPECT_TRUE(exit.exited && exit.code == 1) << exit.ToString();
  EXPECT_THAT(out, HasSubstr(absl::StrCat(trace, ":3: not valid JSON")));

  // --on-bad-line=skip replays the good lines.
  StartServer();
  exit = Run({"--workload=trace", absl::StrCat("--trace=", trace), "--on-bad-line=skip",
              absl::StrCat("--target=", server_->address()), "--progress=off",
              absl::StrCat("--output_json=", dir_->File("skip.json"))},
             &out);
  ASSERT_TRUE(exit.Success()) << exit.ToString() << "\n" << out;
  EXPECT_THAT(out, HasSubstr(absl::StrCat("skipped ", trace, ":3: not valid JSON")));
  const nlohmann::json j = nlohmann::json::parse(ReadFile(dir_->File("skip.json")));
  EXPECT_EQ(j["completed"], 2);
  EXPECT_EQ(j["config"]["trace_skipped_lines"], "1");
}

TEST_F(PdLoadtestBinaryTest, SigintWritesThePartialReportAndExits130) {
  FakeGenerationServerOptions so;
  so.token_delay = absl::Milliseconds(20);  // 10,000 tokens: minutes per request
  StartServer(so);
  const std::string json = dir_->File("partial.json");
  const std::string csv = dir_->File("partial.csv");
  absl::StatusOr<Subprocess> p =
      Subprocess::Spawn({kBinary, absl::StrCat("--target=", server_->address()), "--concurrency=3",
                         "--duration=10m", "--output_len=10000", "--input_len=8", "--progress=off",
                         absl::StrCat("--output_json=", json), absl::StrCat("--output_csv=", csv)},
                        dir_->File("sigint.log"));
  ASSERT_TRUE(p.ok()) << p.status();
  ASSERT_TRUE(server_->WaitForActiveStreams(3, absl::Seconds(60))) << p->LogTail();
  ASSERT_EQ(server_->stats().active_streams, 3) << p->LogTail();
  ASSERT_TRUE(p->Signal(SIGINT).ok());
  absl::StatusOr<ExitInfo> exit = p->Wait(absl::Seconds(60));
  ASSERT_TRUE(exit.ok()) << exit.status();
  EXPECT_TRUE(exit->exited && exit->code == 130) << exit->ToString() << "\n" << p->LogTail();
  const nlohmann::json j = nlohmann::json::parse(ReadFile(json));
  EXPECT_EQ(j["interrupted"], true);
  EXPECT_EQ(j["cancelled"], 3);
  EXPECT_EQ(j["completed"], 0);
  std::vector<std::string> lines = absl::StrSplit(ReadFile(csv), '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), 4u);
  EXPECT_THAT(lines[1], HasSubstr(",CANCELLED_BY_CLIENT,"));
  EXPECT_THAT(p->ReadLog(), HasSubstr("INTERRUPTED"));
}

}  // namespace
}  // namespace pd::loadtest
