#include "services/router/openai/connection_stream.h"

#include <httplib.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>

#include "gtest/gtest.h"
#include "services/router/openai/http_connections.h"

namespace pd::router::openai::http_internal {
namespace {

class ConnectionStreamTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, fds_), 0); }
  void TearDown() override {
    for (int fd : fds_) {
      if (fd >= 0) ::close(fd);
    }
  }
  // A connection on fds_[0] with `bytes` buffered and framed.
  Conn Buffered(const std::string& bytes) {
    Conn c(fds_[0], "127.0.0.1", 4242, FramingLimits());
    c.buf = bytes;
    EXPECT_EQ(c.framer.Scan(c.buf), RequestFramer::State::kComplete);
    return c;
  }
  int fds_[2] = {-1, -1};
};

TEST_F(ConnectionStreamTest, ReadsExactlyTheBufferedRequest) {
  const std::string first = "POST / HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc";
  Conn c = Buffered(first + "GET /next HTTP/1.1\r\n\r\n");
  std::string read;
  EXPECT_TRUE(ServeBuffered(c, absl::Seconds(1), [&](httplib::Stream& strm) {
    char buf[7];
    ssize_t n;
    while ((n = strm.read(buf, sizeof(buf))) > 0) read.append(buf, static_cast<size_t>(n));
    std::string ip;
    int port = 0;
    strm.get_remote_ip_and_port(ip, port);
    EXPECT_EQ(ip, "127.0.0.1");
    EXPECT_EQ(port, 4242);
    return n == 0;  // the end of the request reads as the end of the stream
  }));
  EXPECT_EQ(read, first);
}

TEST_F(ConnectionStreamTest, CurrentClientGoneSeesTheClientClose) {
  Conn c = Buffered("GET / HTTP/1.1\r\n\r\n");
  EXPECT_FALSE(CurrentClientGone());  // no request on this thread
  bool before = true, pipelined = true, after = false;
  ServeBuffered(c, absl::Seconds(1), [&](httplib::Stream&) {
    before = CurrentClientGone();
    (void)!::write(fds_[1], "G", 1);  // a pipelined next request is not a hang-up
    pipelined = CurrentClientGone();
    char byte;
    (void)!::read(fds_[0], &byte, 1);
    ::close(fds_[1]);
    fds_[1] = -1;
    after = CurrentClientGone();
    return true;
  });
  EXPECT_FALSE(before);
  EXPECT_FALSE(pipelined);
  EXPECT_TRUE(after);
  EXPECT_FALSE(CurrentClientGone());
}

TEST_F(ConnectionStreamTest, AContinueTheWaiterSentIsNotSentTwice) {
  Conn c = Buffered("POST / HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 1\r\n\r\nx");
  c.continue_sent = true;
  ServeBuffered(c, absl::Seconds(1), [&](httplib::Stream& strm) {
    const std::string cont = kContinue;
    EXPECT_EQ(strm.write(cont.data(), cont.size()), static_cast<ssize_t>(cont.size()));
    EXPECT_EQ(strm.write("HTTP/1.1 200 OK\r\n", 17), 17);
    return true;
  });
  char buf[64];
  const ssize_t n = ::recv(fds_[1], buf, sizeof(buf), MSG_DONTWAIT);
  EXPECT_EQ(std::string(buf, static_cast<size_t>(std::max<ssize_t>(n, 0))), "HTTP/1.1 200 OK\r\n");
}

}  // namespace
}  // namespace pd::router::openai::http_internal
