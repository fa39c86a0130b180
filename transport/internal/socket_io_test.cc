#include "transport/internal/socket_io.h"

#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "transport/internal/socket_util.h"

namespace pd::transport::transport_internal {
namespace {

// A connected stream pair set up as the backends set up their sockets (short timeout slices).
class SocketIoTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds_), 0);
    for (int fd : fds_) {
      SetStreamSocketOptions(fd, absl::Milliseconds(5));
    }
  }
  void TearDown() override {
    for (int fd : fds_) {
      if (fd >= 0) {
        ::close(fd);
      }
    }
  }
  int fds_[2] = {-1, -1};
};

TEST_F(SocketIoTest, WriteAllSendsEveryIovecAndReadFullReadsThemBack) {
  std::string a = "header";
  std::string b(100000, 'x');  // larger than one socket buffer: several sendmsg calls
  b[0] = 'y';
  b.back() = 'z';
  std::vector<char> got(a.size() + b.size());
  SocketIo read_result = SocketIo::kFailed;
  std::thread reader(
      [&] { read_result = ReadFull(fds_[1], got.data(), got.size(), [] { return true; }); });
  EXPECT_EQ(WriteAll(fds_[0], {{a.data(), a.size()}, {b.data(), b.size()}}, [] { return true; }),
            SocketIo::kOk);
  reader.join();
  EXPECT_EQ(read_result, SocketIo::kOk);
  EXPECT_EQ(std::string(got.data(), got.size()), a + b);
}

TEST_F(SocketIoTest, ReadFullStopsWhenKeepGoingTurnsFalse) {
  char buf[4];
  int asked = 0;
  EXPECT_EQ(ReadFull(fds_[1], buf, sizeof(buf), [&] { return ++asked < 3; }), SocketIo::kStopped);
  EXPECT_EQ(asked, 3);  // asked once per timeout slice
}

TEST_F(SocketIoTest, ReadFullReportsAClosedPeer) {
  ASSERT_EQ(::write(fds_[0], "ab", 2), 2);
  ::close(fds_[0]);
  fds_[0] = -1;
  char buf[4];
  EXPECT_EQ(ReadFull(fds_[1], buf, sizeof(buf), [] { return true; }), SocketIo::kClosed);
}

TEST_F(SocketIoTest, FailuresCarryTheErrno) {
  int error = 0;
  char buf[1] = {'a'};
  EXPECT_EQ(WriteAll(
                -1, {{buf, sizeof(buf)}}, [] { return true; }, &error),
            SocketIo::kFailed);
  EXPECT_EQ(error, EBADF);
  error = 0;
  EXPECT_EQ(ReadFull(
                -1, buf, sizeof(buf), [] { return true; }, &error),
            SocketIo::kFailed);
  EXPECT_EQ(error, EBADF);
}

TEST_F(SocketIoTest, WriteAllStopsWhenThePeerStalls) {
  // Nobody reads fds_[1]: once the buffers are full, every slice passes without progress.
  std::string big(8 << 20, 'x');
  int asked = 0;
  EXPECT_EQ(WriteAll(fds_[0], {{big.data(), big.size()}}, [&] { return ++asked < 2; }),
            SocketIo::kStopped);
  EXPECT_EQ(asked, 2);
}

}  // namespace
}  // namespace pd::transport::transport_internal
