#include "transport/conformance/peer_control.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace pd::transport::conformance {

absl::StatusOr<std::unique_ptr<PeerControl>> PeerControl::Start(const std::string& binary,
                                                                std::vector<std::string> args,
                                                                const std::string& log_path,
                                                                absl::Duration timeout) {
  const int lfd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  if (lfd < 0 || ::bind(lfd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      ::listen(lfd, 1) != 0 || ::getsockname(lfd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    if (lfd >= 0) {
      ::close(lfd);
    }
    return absl::InternalError(absl::StrCat("control listen: ", std::strerror(errno)));
  }
  std::vector<std::string> argv = {binary};
  argv.insert(argv.end(), args.begin(), args.end());
  argv.push_back(absl::StrCat("--control=127.0.0.1:", ntohs(addr.sin_port)));
  absl::StatusOr<testing::Subprocess> p = testing::Subprocess::Spawn(argv, log_path);
  if (!p.ok()) {
    ::close(lfd);
    return p.status();
  }
  std::unique_ptr<PeerControl> pc(new PeerControl());
  pc->process_.emplace(*std::move(p));
  pollfd pfd{lfd, POLLIN, 0};
  const int r = ::poll(&pfd, 1, static_cast<int>(absl::ToInt64Milliseconds(timeout)));
  if (r == 1) {
    pc->fd_ = ::accept4(lfd, nullptr, nullptr, SOCK_CLOEXEC);
  }
  ::close(lfd);
  if (pc->fd_ < 0) {
    return absl::DeadlineExceededError(
        absl::StrCat("peer did not connect back; log:\n", pc->process_->LogTail()));
  }
  return pc;
}

PeerControl::~PeerControl() {
  if (fd_ >= 0) {
    ::close(fd_);
  }
}

absl::StatusOr<std::string> PeerControl::Call(const std::string& line, absl::Duration timeout) {
  const std::string out = line + "\n";
  if (::send(fd_, out.data(), out.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(out.size())) {
    return absl::UnavailableError(
        absl::StrCat("peer control send failed; log:\n", process_->LogTail()));
  }
  const absl::Time deadline = absl::Now() + timeout;
  size_t nl;
  while ((nl = buf_.find('\n')) == std::string::npos) {
    const absl::Duration left = deadline - absl::Now();
    pollfd pfd{fd_, POLLIN, 0};
    if (left <= absl::ZeroDuration() ||
        ::poll(&pfd, 1, static_cast<int>(absl::ToInt64Milliseconds(left)) + 1) == 0) {
      return absl::DeadlineExceededError(absl::StrCat("peer did not answer '", line, "'"));
    }
    char chunk[65536];
    const ssize_t n = ::recv(fd_, chunk, sizeof(chunk), 0);
    if (n <= 0) {
      return absl::UnavailableError(
          absl::StrCat("peer closed control; log:\n", process_->LogTail()));
    }
    buf_.append(chunk, static_cast<size_t>(n));
  }
  std::string reply = buf_.substr(0, nl);
  buf_.erase(0, nl + 1);
  if (reply == "ok") {
    return std::string();
  }
  if (absl::StartsWith(reply, "ok ")) {
    return reply.substr(3);
  }
  return absl::InternalError(absl::StrCat("peer: ", reply));
}

}  // namespace pd::transport::conformance
