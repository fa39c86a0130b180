#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "common/testing/net.h"
#include "common/testing/temp_dir.h"
#include "gtest/gtest.h"

namespace pd::testing {
namespace {

TEST(TestingHelpersTest, FreePortIsInRange) {
  absl::StatusOr<int> port = PickFreeLoopbackPort();
  ASSERT_TRUE(port.ok()) << port.status();
  EXPECT_GT(*port, 0);
  EXPECT_LT(*port, 65536);
}

// A socket listening on 127.0.0.1 and one on [::1] show up with their ports; a socket that is
// bound but not listening, and one that is closed, do not.
TEST(TestingHelpersTest, ListeningTcpSocketsOfThisProcess) {
  auto listen_on = [](int family, bool do_listen) {
    const int fd = ::socket(family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    EXPECT_GE(fd, 0);
    sockaddr_storage ss{};
    socklen_t len = 0;
    if (family == AF_INET) {
      auto* a = reinterpret_cast<sockaddr_in*>(&ss);
      a->sin_family = AF_INET;
      a->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      len = sizeof(*a);
    } else {
      auto* a = reinterpret_cast<sockaddr_in6*>(&ss);
      a->sin6_family = AF_INET6;
      a->sin6_addr = in6addr_loopback;
      len = sizeof(*a);
    }
    if (::bind(fd, reinterpret_cast<sockaddr*>(&ss), len) != 0 ||
        (do_listen && ::listen(fd, 1) != 0) ||
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) {
      ::close(fd);
      return std::make_pair(-1, 0);
    }
    const int port = ntohs(family == AF_INET ? reinterpret_cast<sockaddr_in*>(&ss)->sin_port
                                             : reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port);
    return std::make_pair(fd, port);
  };
  const auto [v4, v4_port] = listen_on(AF_INET, true);
  const auto [bound, bound_port] = listen_on(AF_INET, false);
  const auto [v6, v6_port] = listen_on(AF_INET6, true);  // -1 where IPv6 is off
  ASSERT_GE(v4, 0);
  ASSERT_GE(bound, 0);
  absl::StatusOr<std::vector<ListeningSocket>> socks = ListeningTcpSockets();
  ASSERT_TRUE(socks.ok()) << socks.status();
  bool saw_v4 = false, saw_v6 = false;
  for (const ListeningSocket& s : *socks) {
    EXPECT_NE(s.port, bound_port) << s.ToString();
    saw_v4 = saw_v4 || (s.ip == "127.0.0.1" && s.port == v4_port && s.IsLoopback());
    saw_v6 = saw_v6 || (s.ip == "::1" && s.port == v6_port && s.IsLoopback());
  }
  EXPECT_TRUE(saw_v4);
  EXPECT_EQ(saw_v6, v6 >= 0);
  EXPECT_FALSE((ListeningSocket{"0.0.0.0", 1}).IsLoopback());
  EXPECT_FALSE((ListeningSocket{"::", 1}).IsLoopback());
  EXPECT_FALSE((ListeningSocket{"192.0.2.2", 1}).IsLoopback());
  EXPECT_TRUE((ListeningSocket{"::ffff:127.0.0.1", 1}).IsLoopback());
  EXPECT_EQ((ListeningSocket{"::1", 80}).ToString(), "[::1]:80");
  ::close(v4);
  ::close(bound);
  if (v6 >= 0) {
    ::close(v6);
  }
  socks = ListeningTcpSockets();
  ASSERT_TRUE(socks.ok()) << socks.status();
  for (const ListeningSocket& s : *socks) {
    EXPECT_NE(s.port, v4_port) << "closed, still listed: " << s.ToString();
  }
  EXPECT_EQ(ListeningTcpSockets(-5).status().code(), absl::StatusCode::kNotFound);
}

TEST(TestingHelpersTest, TempDirIsRemovedWithContents) {
  std::string path;
  {
    absl::StatusOr<TempDir> dir = TempDir::Create();
    ASSERT_TRUE(dir.ok()) << dir.status();
    path = dir->path();
    std::ofstream(dir->File("x.txt")) << "hello";
    struct stat st;
    ASSERT_EQ(::stat(dir->File("x.txt").c_str(), &st), 0);
    TempDir moved = std::move(*dir);  // ownership moves; only one removal
    EXPECT_EQ(moved.path(), path);
  }
  struct stat st;
  EXPECT_NE(::stat(path.c_str(), &st), 0);
}

}  // namespace
}  // namespace pd::testing
