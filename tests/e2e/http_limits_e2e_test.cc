// pd-router's HTTP API under slow and hostile clients (issue #39): hundreds of connections that
// trickle a request's head or body neither hold threads nor lock out /health and completions,
// and each is closed at its total deadline; the per-client and total connection caps reset
// connections at accept and count them; framing errors (conflicting or signed Content-Length,
// no length, a huge length, unknown transfer codings) are answered at once. A real router and
// decode worker (stories260K) on loopback; the second client address of the cap test is
// 127.0.0.2 (loopback too).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include <httplib.h>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/testing/temp_dir.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/e2e/cluster_fixture.h"

namespace pd {
namespace {

using ::pd::e2e::Cluster;
using ::pd::e2e::Metric;
using ::testing::HasSubstr;

constexpr int kMaxServing = 4;     // --http_max_connections
constexpr int kPerClient = 400;    // --http_max_connections_per_client
constexpr int kMaxOpen = 500;      // --http_max_open_connections
constexpr absl::Duration kHeaderTimeout = absl::Seconds(2);
constexpr absl::Duration kBodyTimeout = absl::Seconds(2);
constexpr char kCompletion[] =
    R"({"model":"stories260K","prompt":"Once upon a time","max_tokens":8,"temperature":0})";

// A blocking TCP connection from `from` (a loopback address) to 127.0.0.1:`port`; -1 on error.
int Connect(const char* from, int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_in src{};
  src.sin_family = AF_INET;
  ::inet_pton(AF_INET, from, &src.sin_addr);
  sockaddr_in dst{};
  dst.sin_family = AF_INET;
  dst.sin_port = htons(static_cast<uint16_t>(port));
  ::inet_pton(AF_INET, "127.0.0.1", &dst.sin_addr);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&src), sizeof(src)) != 0 ||
      ::connect(fd, reinterpret_cast<sockaddr*>(&dst), sizeof(dst)) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

bool SendAll(int fd, const std::string& bytes) {
  return ::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL) ==
         static_cast<ssize_t>(bytes.size());
}

// Everything `fd` delivers until the peer ends the connection (FIN or reset) or `timeout`.
// `closed` tells which.
std::string ReadUntilClosed(int fd, absl::Duration timeout, bool* closed) {
  std::string got;
  const absl::Time deadline = absl::Now() + timeout;
  *closed = false;
  for (;;) {
    pollfd p = {fd, POLLIN, 0};
    const int left = static_cast<int>(
        std::max<int64_t>(0, absl::ToInt64Milliseconds(deadline - absl::Now())));
    if (::poll(&p, 1, left) != 1) return got;
    char buf[4096];
    const ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) {
      *closed = true;
      return got;
    }
    got.append(buf, static_cast<size_t>(n));
  }
}

// The status of an HTTP response's first line, 0 if there is none.
int StatusOf(const std::string& response) {
  int status = 0;
  if (!absl::StartsWith(response, "HTTP/1.1 ") ||
      !absl::SimpleAtoi(response.substr(9, 3), &status)) {
    return 0;
  }
  return status;
}

// A GET /health over a raw connection from `from`: the status, 0 when none came.
int Health(const char* from, int port) {
  const int fd = Connect(from, port);
  if (fd < 0) return 0;
  absl::Cleanup close_fd = [fd] { ::close(fd); };
  if (!SendAll(fd, "GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")) {
    return 0;
  }
  bool closed;
  return StatusOf(ReadUntilClosed(fd, absl::Seconds(5), &closed));
}

int RouterThreads(pid_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(in, line)) {
    int n = 0;
    if (absl::StartsWith(line, "Threads:") && absl::SimpleAtoi(line.substr(8), &n)) return n;
  }
  return -1;
}

class HttpLimitsE2eTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<pd::testing::TempDir> dir = pd::testing::TempDir::Create("pd-http-limits-");
    ASSERT_TRUE(dir.ok()) << dir.status();
    dir_.emplace(*std::move(dir));
    cluster_.emplace(
        dir_->path(), 0, 1, "round_robin", std::vector<std::string>{},
        std::vector<std::string>{
            absl::StrCat("--http_address=127.0.0.1:", pd::e2e::kHttpPort), "--http_max_body_bytes=65536",
            absl::StrCat("--http_max_connections=", kMaxServing),
            absl::StrCat("--http_max_connections_per_client=", kPerClient),
            absl::StrCat("--http_max_open_connections=", kMaxOpen), "--http_idle_timeout=10s",
            absl::StrCat("--http_header_timeout=", absl::ToInt64Seconds(kHeaderTimeout), "s"),
            absl::StrCat("--http_body_timeout=", absl::ToInt64Seconds(kBodyTimeout), "s")});
    ASSERT_TRUE(cluster_->WaitReady(absl::Seconds(60))) << cluster_->Logs();
    port_ = cluster_->http_port();
  }

  double Refused(const std::string& reason) {
    return Metric(cluster_->RouterMetrics(),
                  absl::StrCat("pd_router_http_connections_refused_total{reason=\"", reason, "\"}"),
                  -1);
  }

  std::optional<pd::testing::TempDir> dir_;
  std::optional<Cluster> cluster_;
  int port_ = 0;
};

// 300 connections trickle their request a byte at a time (150 in the head, 150 in the body,
// against --http_max_connections=4): /health and a completion still answer 200 at once, the
// router's thread count hardly moves, and every slow connection gets 408 and is closed at its
// total deadline, though it kept sending.
TEST_F(HttpLimitsE2eTest, SlowClientsDoNotLockOutOthersAndCloseAtTheirDeadline) {
  constexpr int kSlow = 300;
  const int threads_before = RouterThreads(cluster_->router().pid());
  ASSERT_GT(threads_before, 0);
  struct Slow {
    int fd = -1;
    bool in_body = false;
    absl::Time start;  // its deadline's start: the first head byte, or the end of the head
    absl::Time closed_at = absl::InfiniteFuture();
    std::string got;
  };
  std::vector<Slow> slow(kSlow);
  absl::Cleanup close_all = [&slow] {
    for (const Slow& s : slow) {
      if (s.fd >= 0) ::close(s.fd);
    }
  };
  const std::string body_head =
      "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
      "Content-Length: 1000\r\n\r\n";
  for (int i = 0; i < kSlow; ++i) {
    Slow& s = slow[i];
    s.fd = Connect("127.0.0.1", port_);
    ASSERT_GE(s.fd, 0) << i;
    s.in_body = i % 2 == 1;
    s.start = absl::Now();
    ASSERT_TRUE(SendAll(s.fd, s.in_body ? body_head : "P")) << i;
  }
  // Trickle one byte per connection every 100 ms (the head: a header that never ends; the body:
  // never the whole of it) and note when the router ends each connection.
  const std::string head_bytes = "OST /v1/completions HTTP/1.1\r\nX-Slow: ";
  bool checked = false;
  const absl::Time begin = absl::Now();
  for (int round = 0; absl::Now() < begin + kHeaderTimeout + absl::Seconds(4); ++round) {
    int open = 0;
    for (Slow& s : slow) {
      if (s.closed_at != absl::InfiniteFuture()) continue;
      ++open;
      char buf[4096];
      const ssize_t n = ::recv(s.fd, buf, sizeof(buf), MSG_DONTWAIT);
      if (n > 0) s.got.append(buf, static_cast<size_t>(n));
      if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK)) {
        s.closed_at = absl::Now();
        continue;
      }
      const std::string next =
          s.in_body ? "a"
                    : std::string(1, static_cast<size_t>(round) < head_bytes.size()
                                         ? head_bytes[static_cast<size_t>(round)]
                                         : 'x');
      (void)::send(s.fd, next.data(), 1, MSG_NOSIGNAL);
    }
    if (open == 0) break;
    if (!checked && absl::Now() > begin + absl::Milliseconds(500)) {
      checked = true;
      // All 300 are open and waiting; none holds a thread or a serving slot.
      const std::string m = cluster_->RouterMetrics();
      EXPECT_EQ(Metric(m, "pd_router_http_connections_waiting", -1), kSlow) << m;
      const int threads = RouterThreads(cluster_->router().pid());
      std::cout << "router threads: " << threads_before << " before, " << threads << " with "
                << kSlow << " slow connections\n";
      EXPECT_LT(threads, threads_before + 20);
      const absl::Time asked = absl::Now();
      EXPECT_EQ(Health("127.0.0.1", port_), 200);
      httplib::Client http("127.0.0.1", port_);
      http.set_read_timeout(30, 0);
      httplib::Result res = http.Post("/v1/completions", kCompletion, "application/json");
      ASSERT_TRUE(res) << cluster_->Logs();
      EXPECT_EQ(res->status, 200) << res->body;
      EXPECT_LT(absl::Now() - asked, absl::Seconds(5));
    }
    absl::SleepFor(absl::Milliseconds(100));
  }
  ASSERT_TRUE(checked);
  for (int i = 0; i < kSlow; ++i) {
    const Slow& s = slow[i];
    SCOPED_TRACE(absl::StrCat("connection ", i, s.in_body ? " (body)" : " (head)"));
    ASSERT_NE(s.closed_at, absl::InfiniteFuture()) << "still open";
    const absl::Duration lived = s.closed_at - s.start;
    EXPECT_GE(lived, kHeaderTimeout - absl::Milliseconds(200));
    EXPECT_LT(lived, kHeaderTimeout + absl::Seconds(2));
    if (!s.got.empty()) {
      EXPECT_TRUE(absl::StartsWith(s.got, "HTTP/1.1 408")) << s.got;
      EXPECT_THAT(s.got, HasSubstr(s.in_body ? "--http_body_timeout" : "--http_header_timeout"));
    }
  }
  EXPECT_EQ(Refused("header_timeout"), kSlow / 2);
  EXPECT_EQ(Refused("body_timeout"), kSlow / 2);
  EXPECT_THAT(cluster_->router().LogTail(50), HasSubstr("header_timeout="));
}

// The per-client cap resets the client's next connection at accept, another client still gets
// in; the total cap resets everyone's; both come back once connections close.
TEST_F(HttpLimitsE2eTest, PerClientAndTotalCapsResetAtAccept) {
  std::vector<int> fds;
  absl::Cleanup close_all = [&fds] {
    for (int fd : fds) ::close(fd);
  };
  for (int i = 0; i < kPerClient; ++i) {
    fds.push_back(Connect("127.0.0.1", port_));
    ASSERT_GE(fds.back(), 0) << i;
  }
  auto open_connections = [&] {
    return Metric(cluster_->RouterMetrics(), "pd_router_http_connections", -1);
  };
  const absl::Time until = absl::Now() + absl::Seconds(5);
  while (open_connections() < kPerClient && absl::Now() < until) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  ASSERT_EQ(open_connections(), kPerClient);
  // 127.0.0.1 is at its cap: its next connection is reset unanswered; 127.0.0.2 gets in.
  EXPECT_EQ(Health("127.0.0.1", port_), 0);
  EXPECT_GE(Refused("client_limit"), 1);
  EXPECT_EQ(Health("127.0.0.2", port_), 200);
  // 127.0.0.2 fills the total; then 127.0.0.3 is reset too.
  for (int i = kPerClient; i < kMaxOpen; ++i) {
    fds.push_back(Connect("127.0.0.2", port_));
    ASSERT_GE(fds.back(), 0) << i;
  }
  while (open_connections() < kMaxOpen && absl::Now() < until + absl::Seconds(5)) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  ASSERT_EQ(open_connections(), kMaxOpen);
  EXPECT_EQ(Health("127.0.0.3", port_), 0);
  EXPECT_GE(Refused("open_limit"), 1) << cluster_->RouterMetrics() << cluster_->router().LogTail(20);
  EXPECT_THAT(cluster_->router().LogTail(50), HasSubstr("client_limit="));
  // Ten of 127.0.0.1's close: it is served again.
  for (int i = 0; i < 10; ++i) ::close(fds[static_cast<size_t>(i)]);
  fds.erase(fds.begin(), fds.begin() + 10);
  const absl::Time again = absl::Now() + absl::Seconds(5);
  int status = 0;
  while ((status = Health("127.0.0.1", port_)) != 200 && absl::Now() < again) {
    absl::SleepFor(absl::Milliseconds(50));
  }
  EXPECT_EQ(status, 200);
}

// Framing errors get their status and an OpenAI error object at once (before, a missing or
// malformed length waited for the 30 s read timeout, and a signed or second length was
// accepted); a chunked body and "Expect: 100-continue" still work.
TEST_F(HttpLimitsE2eTest, FramingErrorsAreAnsweredAtOnce) {
  const std::string post = "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n";
  struct Case {
    std::string name, request;
    int status;
    std::string message;
  };
  const std::vector<Case> cases = {
      {"two lengths", post + "Content-Length: 5\r\nContent-Length: 7\r\n\r\nhello", 400,
       "conflicting Content-Length"},
      {"signed length", post + "Content-Length: +5\r\n\r\nhello", 400, "digits only"},
      {"malformed length", post + "Content-Length: 5x\r\n\r\nhello", 400, "digits only"},
      {"no length", post + "\r\n{}", 411, "Content-Length"},
      {"10^23", post + "Content-Length: 100000000000000000000000\r\n\r\n{", 413,
       "--http_max_body_bytes"},
      {"over the limit", post + "Content-Length: 65537\r\n\r\n{", 413, "--http_max_body_bytes"},
      {"length and chunked", post + "Content-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n",
       400, "Transfer-Encoding"},
      {"gzip coding", post + "Transfer-Encoding: gzip\r\n\r\n", 501, "Transfer-Encoding"},
      {"bare LF", "POST /v1/completions HTTP/1.1\nContent-Length: 2\n\n{}", 400, "bare LF"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const int fd = Connect("127.0.0.1", port_);
    ASSERT_GE(fd, 0);
    absl::Cleanup close_fd = [fd] { ::close(fd); };
    const absl::Time sent = absl::Now();
    ASSERT_TRUE(SendAll(fd, c.request));
    bool closed = false;
    const std::string reply = ReadUntilClosed(fd, absl::Seconds(10), &closed);
    EXPECT_LT(absl::Now() - sent, absl::Seconds(2));
    EXPECT_TRUE(closed);
    EXPECT_EQ(StatusOf(reply), c.status) << reply;
    const size_t body_at = reply.find("\r\n\r\n");
    ASSERT_NE(body_at, std::string::npos) << reply;
    const nlohmann::json body = nlohmann::json::parse(reply.substr(body_at + 4), nullptr, false);
    ASSERT_TRUE(body.is_object() && body.contains("error")) << reply;
    EXPECT_THAT(body["error"]["message"].get<std::string>(), HasSubstr(c.message));
  }
  EXPECT_EQ(Refused("framing"), static_cast<double>(cases.size()));

  // A chunked body in three chunks, and a body sent after the router's "100 Continue", each
  // answered 200 once (no second 100 in the response).
  const std::string json = kCompletion;
  const std::string chunked =
      post + "Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n" +
      absl::StrCat(absl::Hex(10), "\r\n", json.substr(0, 10), "\r\n",
                   absl::Hex(json.size() - 20), "\r\n", json.substr(10, json.size() - 20), "\r\n",
                   absl::Hex(10), "\r\n", json.substr(json.size() - 10), "\r\n0\r\n\r\n");
  int fd = Connect("127.0.0.1", port_);
  ASSERT_GE(fd, 0);
  ASSERT_TRUE(SendAll(fd, chunked));
  bool closed = false;
  std::string reply = ReadUntilClosed(fd, absl::Seconds(30), &closed);
  ::close(fd);
  EXPECT_EQ(StatusOf(reply), 200) << reply;
  EXPECT_THAT(reply, HasSubstr("\"text\""));

  fd = Connect("127.0.0.1", port_);
  ASSERT_GE(fd, 0);
  ASSERT_TRUE(SendAll(fd, post + absl::StrCat("Expect: 100-continue\r\nConnection: close\r\n"
                                              "Content-Length: ",
                                              json.size(), "\r\n\r\n")));
  pollfd p = {fd, POLLIN, 0};
  ASSERT_EQ(::poll(&p, 1, 2000), 1);
  char buf[256];
  const ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
  ASSERT_GT(n, 0);
  EXPECT_EQ(std::string(buf, static_cast<size_t>(n)), "HTTP/1.1 100 Continue\r\n\r\n");
  ASSERT_TRUE(SendAll(fd, json));
  reply = ReadUntilClosed(fd, absl::Seconds(30), &closed);
  ::close(fd);
  EXPECT_EQ(StatusOf(reply), 200) << reply;
}

}  // namespace
}  // namespace pd
