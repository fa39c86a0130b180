#include "services/base/net_address.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/testing/net.h"
#include "gtest/gtest.h"

namespace pd::services {
namespace {

TEST(ParseHostPortTest, ParsesV4V6AndLocalhost) {
  absl::StatusOr<HostPort> a = ParseHostPort("127.0.0.1:50051", "--grpc_address");
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->host, "127.0.0.1");
  EXPECT_EQ(a->port, 50051);
  EXPECT_EQ(a->ToString(), "127.0.0.1:50051");
  absl::StatusOr<HostPort> b = ParseHostPort("[::1]:80", "x");
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->host, "::1");
  EXPECT_EQ(b->ToString(), "[::1]:80");
  EXPECT_TRUE(ParseHostPort("localhost:0", "x").ok());
}

TEST(ParseHostPortTest, RejectsWithTheSettingNamed) {
  for (const char* bad : {"127.0.0.1", "127.0.0.1:", ":80", "h:99999", "h:-1", "h:8o", "[::1]80"}) {
    absl::StatusOr<HostPort> r = ParseHostPort(bad, "--metrics_address");
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(r.status().message().find("--metrics_address"), absl::string_view::npos) << bad;
  }
}

TEST(CheckCanListenTest, FreePortOkTakenPortUnavailable) {
  absl::StatusOr<int> port = pd::testing::PickFreeLoopbackPort();
  ASSERT_TRUE(port.ok());
  EXPECT_TRUE(CheckCanListen({"127.0.0.1", *port}, "--grpc_address").ok());

  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(*port));
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(::listen(fd, 1), 0);
  absl::Status s = CheckCanListen({"127.0.0.1", *port}, "--grpc_address");
  ::close(fd);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_NE(s.message().find("address already in use"), absl::string_view::npos) << s;
  EXPECT_NE(s.message().find(std::to_string(*port)), absl::string_view::npos) << s;
}

TEST(CheckCanListenTest, NonNumericHostRejected) {
  EXPECT_EQ(CheckCanListen({"example.invalid", 80}, "x").code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace pd::services
