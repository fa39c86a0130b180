// pd-router as a real process: startup errors, health, the public API and draining.
#include <grpcpp/grpcpp.h>
#include <httplib.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/testing/net.h"
#include "common/testing/redis_server.h"
#include "common/testing/subprocess.h"
#include "common/testing/temp_dir.h"
#include "gmock/gmock.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "gtest/gtest.h"
#include "pd/v1/generation.grpc.pb.h"

namespace pd {
namespace {

using ::pd::testing::ExitInfo;
using ::pd::testing::Subprocess;
using ::testing::HasSubstr;

constexpr char kRouter[] = PD_BINARY_DIR "/services/router/pd-router";
constexpr char kModelFlag[] = "--model=" PD_SHARED_DIR "/models/stories260K/stories260K.bin";
constexpr char kTokenizerFlag[] = "--tokenizer=" PD_SHARED_DIR "/models/stories260K/tok512.bin";

class RouterE2eTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<pd::testing::TempDir> dir = pd::testing::TempDir::Create("pd-e2e-");
    ASSERT_TRUE(dir.ok()) << dir.status();
    dir_.emplace(*std::move(dir));
  }

  int FreePort() {
    absl::StatusOr<int> port = pd::testing::PickFreeLoopbackPort();
    EXPECT_TRUE(port.ok()) << port.status();
    return port.value_or(0);
  }

  // Runs pd-router with `args` and expects it to fail at startup: non-zero exit within 10 s
  // and exactly one line of output naming `problem`.
  void ExpectStartupError(std::vector<std::string> args, absl::string_view problem) {
    if (with_model_) {
      args.insert(args.begin(), {kModelFlag, kTokenizerFlag, "--decode_workers=127.0.0.1:1"});
    }
    // Ephemeral ports unless the case sets them (later flags win): the default ports may be
    // taken by a local cluster running on this machine.
    args.insert(args.begin(), {"--grpc_address=127.0.0.1:0", "--metrics_address=127.0.0.1:0"});
    args.insert(args.begin(), kRouter);
    absl::StatusOr<Subprocess> p =
        Subprocess::Spawn(args, dir_->File(absl::StrCat("fail", ++runs_, ".log")));
    ASSERT_TRUE(p.ok()) << p.status();
    absl::StatusOr<ExitInfo> exit = p->Wait(absl::Seconds(10));
    ASSERT_TRUE(exit.ok()) << exit.status();
    EXPECT_TRUE(exit->exited) << exit->ToString();
    EXPECT_NE(exit->code, 0);
    const std::string log = p->ReadLog();
    std::vector<absl::string_view> lines = absl::StrSplit(log, '\n', absl::SkipEmpty());
    EXPECT_EQ(lines.size(), 1u) << log;
    EXPECT_THAT(log, HasSubstr(std::string(problem)));
  }

  std::optional<pd::testing::TempDir> dir_;
  int runs_ = 0;
  bool with_model_ = true;  // add --model, --tokenizer and a --decode_workers address
};

TEST_F(RouterE2eTest, BadConfigurationIsOneLineAndNonZeroExit) {
  with_model_ = false;
  ExpectStartupError({}, "--model is required");
  ExpectStartupError({kModelFlag, kTokenizerFlag}, "--decode_workers is empty");
  ExpectStartupError({"--model=/no/such/model", "--decode_workers=127.0.0.1:1"},
                     "--model: model '/no/such/model' does not exist");
  with_model_ = true;
  ExpectStartupError({"--policy=best"}, "--policy must be");
  ExpectStartupError({"--dram_hit_weight=2"}, "--dram_hit_weight must be in [0, 1], got 2");
  ExpectStartupError({"--no_such_flag"}, "no_such_flag");
  ExpectStartupError({"--block_size=abc"}, "block_size");
  ExpectStartupError({"--block_size=0"}, "--block_size must be in [1, 1024], got 0");
  ExpectStartupError({"--grpc_address=127.0.0.1"}, "--grpc_address: expected host:port");

  // Port in use: hold a listening socket on the port.
  const int port = FreePort();
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(::listen(fd, 1), 0);
  ExpectStartupError({absl::StrCat("--grpc_address=127.0.0.1:", port),
                      absl::StrCat("--metrics_address=127.0.0.1:", FreePort())},
                     absl::StrCat("127.0.0.1:", port, ": cannot listen: address already in use"));
  ::close(fd);

  // Unreachable Redis: a free port nobody listens on.
  const int dead = FreePort();
  ExpectStartupError({absl::StrCat("--redis_address=127.0.0.1:", dead),
                      absl::StrCat("--grpc_address=127.0.0.1:", FreePort())},
                     absl::StrCat("redis 127.0.0.1:", dead, ": connect: connection refused"));
}

// A chat template that cannot render a small conversation within its limits stops the router at
// startup (issue 40: it cost 17.6 s and 366 MB per chat request before its 400).
TEST_F(RouterE2eTest, PathologicalChatTemplateIsAStartupError) {
  const std::string hostile = dir_->File("hostile.jinja");
  std::ofstream(hostile) << "{% for i in range(1000000) %}{% for j in range(1000000) %}{{ i }}"
                            "{% endfor %}{% endfor %}";
  ExpectStartupError({"--http_address=127.0.0.1:0", "--chat_template=" + hostile},
                     "--chat_template " + hostile +
                         ": the chat template exceeds its limits on a 3-message sample "
                         "conversation: template render exceeded its memory limit of 67108864 "
                         "bytes");
  ExpectStartupError({"--http_address=127.0.0.1:0", "--chat_template_max_in_flight=0"},
                     "--chat_template_max_*: chat template max_in_flight must be positive, got 0");
  ExpectStartupError({"--http_address=127.0.0.1:0", "--chat_template_max_duration=0s"},
                     "max_duration must be positive");
}

TEST_F(RouterE2eTest, BadSecurityFilesAreOneLineStartupErrorsThatNeverQuoteASecret) {
  const std::string keys = dir_->File("api-keys");
  std::ofstream(keys) << "# keys\ntenant-a:short-secret\n";
  ExpectStartupError({"--api_keys_file=" + keys},
                     "--api_keys_file " + keys + ":2: key of tenant 'tenant-a' has 12 bytes");
  ExpectStartupError({"--api_keys_file=" + keys + ".missing"}, "--api_keys_file: cannot read");
  const std::string token = dir_->File("token");
  std::ofstream(token) << "tiny-token\n";
  ExpectStartupError({"--cluster_token_file=" + token}, "--cluster_token_file: the secret in");
  ExpectStartupError({"--tls_cert=" + keys}, "--tls_cert and --tls_key must be set together");
  ExpectStartupError({"--tls_cert=" + keys, "--tls_key=" + keys},
                     "--tls_cert: " + keys + " holds no PEM data");
  ExpectStartupError({"--client_tls_cert=" + keys, "--client_tls_key=" + keys},
                     "--client_tls_cert needs --client_tls_ca");
  for (int i = 1; i <= runs_; ++i) {
    std::ifstream in(dir_->File(absl::StrCat("fail", i, ".log")));
    std::stringstream text;
    text << in.rdbuf();
    const std::string log = text.str();
    EXPECT_THAT(log, ::testing::Not(HasSubstr("short-secret")));
    EXPECT_THAT(log, ::testing::Not(HasSubstr("tiny-token")));
  }
}

TEST_F(RouterE2eTest, ServesHealthApiAndMetricsThenDrainsOnSigterm) {
  absl::StatusOr<std::unique_ptr<pd::testing::RedisServer>> redis =
      pd::testing::RedisServer::Start({});
  ASSERT_TRUE(redis.ok()) << redis.status();
  const int grpc_port = FreePort();
  const int metrics_port = FreePort();
  absl::StatusOr<Subprocess> router = Subprocess::Spawn(
      {kRouter, absl::StrCat("--grpc_address=127.0.0.1:", grpc_port),
       absl::StrCat("--metrics_address=127.0.0.1:", metrics_port),
       absl::StrCat("--redis_address=127.0.0.1:", (*redis)->port()), kModelFlag, kTokenizerFlag,
       absl::StrCat("--decode_workers=127.0.0.1:", FreePort())},
      dir_->File("router.log"));
  ASSERT_TRUE(router.ok()) << router.status();

  auto channel = grpc::CreateChannel(absl::StrCat("127.0.0.1:", grpc_port),
                                     grpc::InsecureChannelCredentials());
  ASSERT_TRUE(channel->WaitForConnected(std::chrono::system_clock::now() + std::chrono::seconds(10)))
      << router->LogTail();

  auto health = grpc::health::v1::Health::NewStub(channel);
  grpc::health::v1::HealthCheckRequest hreq;
  grpc::health::v1::HealthCheckResponse hresp;
  grpc::ClientContext hctx;
  ASSERT_TRUE(health->Check(&hctx, hreq, &hresp).ok());
  EXPECT_EQ(hresp.status(), grpc::health::v1::HealthCheckResponse::SERVING);

  auto api = pdserve::v1::Generation::NewStub(channel);
  {
    grpc::ClientContext ctx;
    pdserve::v1::ListModelsResponse models;
    EXPECT_TRUE(api->ListModels(&ctx, {}, &models).ok());
    EXPECT_EQ(models.models_size(), 0);  // no decode worker is up, so no model is served
  }
  auto generate = [&](const pdserve::v1::GenerateRequest& req) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    auto reader = api->Generate(&ctx, req);
    pdserve::v1::GenerateResponse resp;
    while (reader->Read(&resp)) {
    }
    return reader->Finish();
  };
  pdserve::v1::GenerateRequest bad;
  bad.mutable_sampling()->set_temperature(-1);
  bad.set_text("hi");
  grpc::Status s = generate(bad);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("sampling.temperature"));
  pdserve::v1::GenerateRequest good;
  good.set_text("Once upon a time");
  s = generate(good);
  // The configured decode worker does not exist: retryable, and says why.
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_THAT(s.error_message(), HasSubstr("no healthy decode worker"));

  httplib::Client http("127.0.0.1", metrics_port);
  auto res = http.Get("/metrics");
  ASSERT_TRUE(res) << "metrics endpoint unreachable";
  EXPECT_EQ(res->status, 200);
  EXPECT_THAT(res->body,
              HasSubstr("pd_router_requests_total{method=\"Generate\",code=\"INVALID_ARGUMENT\"} 1"));
  EXPECT_THAT(res->body,
              HasSubstr("pd_router_requests_total{method=\"Generate\",code=\"UNAVAILABLE\"} 1"));
  EXPECT_THAT(res->body, HasSubstr("pd_router_workers_healthy 0"));

  ASSERT_TRUE(router->Signal(SIGTERM).ok());
  absl::StatusOr<ExitInfo> exit = router->Wait(absl::Seconds(15));
  ASSERT_TRUE(exit.ok()) << exit.status() << "\n" << router->LogTail();
  EXPECT_TRUE(exit->Success()) << exit->ToString() << "\n" << router->LogTail();
  EXPECT_THAT(router->ReadLog(), HasSubstr("pd-router stopped"));
}

}  // namespace
}  // namespace pd
