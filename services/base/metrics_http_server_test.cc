#include "services/base/metrics_http_server.h"

#include <arpa/inet.h>
#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/metrics/metrics.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pd::services {
namespace {

using ::testing::HasSubstr;

// Connects a plain TCP socket to 127.0.0.1:port; returns 0 or the connect errno.
int ConnectErrno(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    return errno;
  }
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  int result = ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 ? 0 : errno;
  ::close(fd);
  return result;
}

class MetricsHttpServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto family = registry_.AddCounter("pd_test_scrapes_total", "Test counter.", {"kind"});
    ASSERT_TRUE(family.ok()) << family.status();
    (*family)->WithLabels({"demo"}).Increment(42);
    registry_.AddCollector([this](metrics::CollectorSink& sink) {
      sink.AddGauge("pd_test_collections", "Collector runs.", ++collections_);
    });
  }

  std::unique_ptr<MetricsHttpServer> StartOrDie(MetricsHttpServerConfig config = {}) {
    auto server = MetricsHttpServer::Start(config, &registry_);
    EXPECT_TRUE(server.ok()) << server.status();
    return server.ok() ? *std::move(server) : nullptr;
  }

  metrics::Registry registry_;
  std::atomic<int> collections_{0};  // incremented by collectors on the server's worker threads
};

TEST_F(MetricsHttpServerTest, ServesMetricsOnEphemeralPort) {
  std::unique_ptr<MetricsHttpServer> server = StartOrDie();
  ASSERT_NE(server, nullptr);
  ASSERT_GT(server->port(), 0);
  EXPECT_EQ(server->bind_address(), "127.0.0.1");

  httplib::Client client("127.0.0.1", server->port());
  httplib::Result first = client.Get("/metrics");
  ASSERT_TRUE(first) << httplib::to_string(first.error());
  EXPECT_EQ(first->status, 200);
  EXPECT_EQ(first->get_header_value("Content-Type"), "text/plain; version=0.0.4; charset=utf-8");
  EXPECT_THAT(first->body, HasSubstr("# TYPE pd_test_scrapes_total counter\n"));
  EXPECT_THAT(first->body, HasSubstr("pd_test_scrapes_total{kind=\"demo\"} 42\n"));
  EXPECT_THAT(first->body, HasSubstr("pd_test_collections 1\n"));

  // Every scrape renders afresh (collectors run per request).
  httplib::Result second = client.Get("/metrics");
  ASSERT_TRUE(second) << httplib::to_string(second.error());
  EXPECT_THAT(second->body, HasSubstr("pd_test_collections 2\n"));
}

TEST_F(MetricsHttpServerTest, HealthzAndUnknownPaths) {
  std::unique_ptr<MetricsHttpServer> server = StartOrDie();
  ASSERT_NE(server, nullptr);
  httplib::Client client("127.0.0.1", server->port());
  httplib::Result health = client.Get("/healthz");
  ASSERT_TRUE(health) << httplib::to_string(health.error());
  EXPECT_EQ(health->status, 200);
  EXPECT_EQ(health->body, "ok");
  for (const char* path : {"/", "/nope", "/metrics/extra", "/healthzz"}) {
    httplib::Result result = client.Get(path);
    ASSERT_TRUE(result) << path;
    EXPECT_EQ(result->status, 404) << path;
  }
}

TEST_F(MetricsHttpServerTest, ConcurrentScrapes) {
  std::unique_ptr<MetricsHttpServer> server = StartOrDie();
  ASSERT_NE(server, nullptr);
  constexpr int kThreads = 4;
  constexpr int kRequests = 10;
  std::vector<std::thread> threads;
  std::atomic<int> ok{0};
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      httplib::Client client("127.0.0.1", server->port());
      for (int i = 0; i < kRequests; ++i) {
        httplib::Result result = client.Get("/metrics");
        if (result && result->status == 200 &&
            result->body.find("pd_test_scrapes_total{kind=\"demo\"} 42") != std::string::npos) {
          ++ok;
        }
      }
    });
  }
  for (std::thread& t : threads) {
    t.join();
  }
  EXPECT_EQ(ok, kThreads * kRequests);
}

TEST_F(MetricsHttpServerTest, SecondServerOnSamePortFailsNamingThePort) {
  std::unique_ptr<MetricsHttpServer> first = StartOrDie();
  ASSERT_NE(first, nullptr);
  MetricsHttpServerConfig config;
  config.port = first->port();
  auto second = MetricsHttpServer::Start(config, &registry_);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable) << second.status();
  EXPECT_THAT(second.status().message(),
              HasSubstr(absl::StrCat("cannot bind 127.0.0.1:", first->port())));
  EXPECT_THAT(second.status().message(), HasSubstr("address already in use"));

  // The first server is unaffected.
  httplib::Client client("127.0.0.1", first->port());
  httplib::Result result = client.Get("/healthz");
  ASSERT_TRUE(result);
  EXPECT_EQ(result->status, 200);
}

TEST_F(MetricsHttpServerTest, StopRefusesNewConnections) {
  std::unique_ptr<MetricsHttpServer> server = StartOrDie();
  ASSERT_NE(server, nullptr);
  const int port = server->port();
  ASSERT_EQ(ConnectErrno(port), 0);
  server->Stop();
  EXPECT_EQ(ConnectErrno(port), ECONNREFUSED);
  httplib::Client client("127.0.0.1", port);
  httplib::Result result = client.Get("/metrics");
  EXPECT_FALSE(result);
  EXPECT_EQ(result.error(), httplib::Error::Connection);
  server->Stop();  // idempotent; the destructor stops again
}

TEST_F(MetricsHttpServerTest, StopWithIdleKeepAliveConnectionIsPrompt) {
  std::unique_ptr<MetricsHttpServer> server = StartOrDie();
  ASSERT_NE(server, nullptr);
  httplib::Client client("127.0.0.1", server->port());
  client.set_keep_alive(true);
  httplib::Result result = client.Get("/healthz");
  ASSERT_TRUE(result);
  // The connection stays open and idle while the server stops.
  auto start = std::chrono::steady_clock::now();
  server->Stop();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(3));
}

TEST_F(MetricsHttpServerTest, StartRejectsBadConfig) {
  struct Case {
    std::string address;
    int port;
  };
  for (const Case& c : std::vector<Case>{
           {"localhost", 0}, {"", 0}, {"127.0.0.1", -1}, {"127.0.0.1", 65536}, {"1.2.3", 80}}) {
    MetricsHttpServerConfig config;
    config.bind_address = c.address;
    config.port = c.port;
    absl::Status status = config.Validate();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << c.address << ":" << c.port;
    EXPECT_THAT(status.message(), HasSubstr("metrics http"));
    EXPECT_EQ(MetricsHttpServer::Start(config, &registry_).status().code(),
              absl::StatusCode::kInvalidArgument);
  }
  EXPECT_TRUE(MetricsHttpServerConfig{}.Validate().ok());
  EXPECT_TRUE((MetricsHttpServerConfig{"::1", 9100}).Validate().ok());
  EXPECT_EQ(MetricsHttpServer::Start({}, nullptr).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(MetricsHttpServerTest, AddressNotOnThisHostIsFailedPrecondition) {
  MetricsHttpServerConfig config;
  config.bind_address = "192.0.2.1";  // TEST-NET-1: never a local address
  auto server = MetricsHttpServer::Start(config, &registry_);
  ASSERT_FALSE(server.ok());
  EXPECT_EQ(server.status().code(), absl::StatusCode::kFailedPrecondition) << server.status();
  EXPECT_THAT(server.status().message(), HasSubstr("cannot bind 192.0.2.1:0"));
}

}  // namespace
}  // namespace pd::services
