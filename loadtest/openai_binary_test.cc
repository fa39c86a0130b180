// The pd-loadtest binary with --backend=openai against the in-process fake OpenAI server (and
// the fake gRPC server for a mixed comparison): flags, reports, exit statuses.
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "common/testing/subprocess.h"
#include "common/testing/temp_dir.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "loadtest/testing/fake_generation_server.h"
#include "loadtest/testing/fake_openai_server.h"

namespace pd::loadtest {
namespace {

using ::pd::testing::ExitInfo;
using ::pd::testing::Subprocess;
using ::testing::HasSubstr;

constexpr char kBinary[] = PD_BINARY_DIR "/loadtest/pd-loadtest";

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

class OpenAiBinaryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<pd::testing::TempDir> dir = pd::testing::TempDir::Create("pd-loadtest-oai-");
    ASSERT_TRUE(dir.ok()) << dir.status();
    dir_.emplace(*std::move(dir));
    absl::StatusOr<std::unique_ptr<testing::FakeOpenAiServer>> s =
        testing::FakeOpenAiServer::Start({});
    ASSERT_TRUE(s.ok()) << s.status();
    server_ = *std::move(s);
  }

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
  std::unique_ptr<testing::FakeOpenAiServer> server_;
  int runs_ = 0;
};

TEST_F(OpenAiBinaryTest, CompletionsRunWritesTheReport) {
  const std::string json = dir_->File("r.json");
  std::string out;
  const ExitInfo exit =
      Run({"--backend=openai", absl::StrCat("--target=", server_->url(), "/v1"), "--concurrency=3",
           "--num-requests=12", "--input-len=8", "--output-len=4", "--vocab-size=1000",
           "--progress=off", absl::StrCat("--output-json=", json)},
          &out);
  ASSERT_TRUE(exit.Success()) << exit.ToString() << "\n" << out;
  EXPECT_THAT(out, HasSubstr("Successful requests:"));
  const nlohmann::json j = nlohmann::json::parse(ReadFile(json));
  EXPECT_EQ(j["completed"], 12);
  EXPECT_EQ(j["total_output_tokens"], 48);
  EXPECT_EQ(j["config"]["backend"], "openai");
  EXPECT_EQ(j["config"]["endpoint"], "completions");
  EXPECT_EQ(server_->stats().requests, 12);
}

TEST_F(OpenAiBinaryTest, CompareGrpcWithOpenAi) {
  absl::StatusOr<std::unique_ptr<testing::FakeGenerationServer>> grpc =
      testing::FakeGenerationServer::Start({});
  ASSERT_TRUE(grpc.ok()) << grpc.status();
  const std::string json = dir_->File("c.json");
  std::string out;
  const ExitInfo exit =
      Run({absl::StrCat("--target=", (*grpc)->address()), "--compare-backend=openai",
           absl::StrCat("--compare-target=", server_->url()), "--concurrency=2", "--num-requests=8",
           "--input-len=8", "--output-len=3", "--vocab-size=1000", "--progress=off",
           absl::StrCat("--output-json=", json)},
          &out);
  ASSERT_TRUE(exit.Success()) << exit.ToString() << "\n" << out;
  const nlohmann::json j = nlohmann::json::parse(ReadFile(json));
  EXPECT_EQ(j["a"]["completed"], 8) << j.dump(2);
  EXPECT_EQ(j["b"]["completed"], 8) << j.dump(2);
  EXPECT_EQ(server_->stats().requests, 8);
  EXPECT_EQ((*grpc)->stats().requests, 8);
}

TEST_F(OpenAiBinaryTest, ConfigErrorsExitOne) {
  std::string out;
  ExitInfo exit = Run({"--backend=openai", absl::StrCat("--target=", server_->url()),
                       "--endpoint=chat", "--concurrency=1", "--num-requests=1"},
                      &out);
  EXPECT_TRUE(exit.exited && exit.code == 1) << exit.ToString();
  EXPECT_THAT(out, HasSubstr("pass --tokenizer"));

  exit = Run({"--backend=openai", "--target=127.0.0.1:8000", "--concurrency=1", "--num-requests=1"},
             &out);
  EXPECT_TRUE(exit.exited && exit.code == 1) << exit.ToString();
  EXPECT_THAT(out, HasSubstr("must be a URL like http://HOST:PORT[/v1]"));

  // No --vocab_size and no --tokenizer: an OpenAI server does not report the vocabulary.
  exit = Run({"--backend=openai", absl::StrCat("--target=", server_->url()), "--concurrency=1",
              "--num-requests=1"},
             &out);
  EXPECT_TRUE(exit.exited && exit.code == 1) << exit.ToString();
  EXPECT_THAT(out, HasSubstr("--vocab_size or --tokenizer"));
}

}  // namespace
}  // namespace pd::loadtest
