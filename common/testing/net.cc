#include "common/testing/net.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"

namespace pd::testing {

namespace {

absl::StatusOr<int> BindEphemeralLoopbackPort() {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    return absl::InternalError(absl::StrCat("socket: ", std::strerror(errno)));
  }
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    int err = errno;
    ::close(fd);
    return absl::InternalError(absl::StrCat("bind 127.0.0.1:0: ", std::strerror(err)));
  }
  ::close(fd);
  return static_cast<int>(ntohs(addr.sin_port));
}

}  // namespace

absl::StatusOr<int> PickFreeLoopbackPort() {
  // Ports this process handed out before: a port picked for one child and not yet bound by it is
  // free again to the kernel, which can return it to the next caller (a CI run picked the
  // router's HTTP port, then a worker got the same port for itself).
  static absl::Mutex mu(absl::kConstInit);
  static absl::flat_hash_set<int>* given = new absl::flat_hash_set<int>();
  absl::MutexLock lock(&mu);
  for (int attempt = 0; attempt < 64; ++attempt) {
    absl::StatusOr<int> port = BindEphemeralLoopbackPort();
    if (!port.ok()) return port.status();
    if (given->insert(*port).second) return *port;
  }
  return absl::InternalError("no loopback port this process has not handed out already");
}

absl::StatusOr<int> ConnectLoopback(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    return absl::InternalError(absl::StrCat("socket: ", std::strerror(errno)));
  }
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (::connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) != 0) {
    const int err = errno;
    ::close(fd);
    return absl::UnavailableError(
        absl::StrCat("connect 127.0.0.1:", port, ": ", std::strerror(err)));
  }
  return fd;
}

namespace {

// A /proc/net/tcp{,6} local address "0100007F:1F90": the address as the kernel's u32 words
// in host order (each printed %08X), then the port.
bool ParseProcAddress(absl::string_view field, ListeningSocket* out) {
  const size_t colon = field.find(':');
  if (colon == absl::string_view::npos) {
    return false;
  }
  const absl::string_view hex = field.substr(0, colon);
  uint32_t port = 0;
  if ((hex.size() != 8 && hex.size() != 32) ||
      !absl::SimpleHexAtoi(field.substr(colon + 1), &port)) {
    return false;
  }
  unsigned char bytes[16] = {};
  for (size_t w = 0; w < hex.size() / 8; ++w) {
    uint32_t word = 0;
    if (!absl::SimpleHexAtoi(hex.substr(8 * w, 8), &word)) {
      return false;
    }
    std::memcpy(bytes + 4 * w, &word, 4);  // back to memory (network) order
  }
  char text[INET6_ADDRSTRLEN] = {};
  if (::inet_ntop(hex.size() == 8 ? AF_INET : AF_INET6, bytes, text, sizeof(text)) == nullptr) {
    return false;
  }
  out->ip = text;
  out->port = static_cast<int>(port);
  return true;
}

}  // namespace

bool ListeningSocket::IsLoopback() const {
  return absl::StartsWith(ip, "127.") || ip == "::1" || absl::StartsWith(ip, "::ffff:127.");
}

std::string ListeningSocket::ToString() const {
  return absl::StrContains(ip, ':') ? absl::StrCat("[", ip, "]:", port)
                                    : absl::StrCat(ip, ":", port);
}

absl::StatusOr<std::vector<ListeningSocket>> ListeningTcpSockets(int pid) {
  const std::string proc = pid == 0 ? "/proc/self" : absl::StrCat("/proc/", pid);
  std::error_code ec;
  std::filesystem::directory_iterator fds(proc + "/fd", ec);
  if (ec) {
    return absl::NotFoundError(absl::StrCat("read ", proc, "/fd: ", ec.message()));
  }
  absl::flat_hash_set<std::string> inodes;
  for (; fds != std::filesystem::directory_iterator(); fds.increment(ec)) {
    std::error_code link_ec;  // an fd closed meanwhile: skipped
    const std::filesystem::path target = std::filesystem::read_symlink(fds->path(), link_ec);
    absl::string_view t = target.native();
    if (!link_ec && absl::ConsumePrefix(&t, "socket:[") && absl::ConsumeSuffix(&t, "]")) {
      inodes.insert(std::string(t));
    }
  }
  if (ec) {
    return absl::NotFoundError(absl::StrCat("read ", proc, "/fd: ", ec.message()));
  }
  std::vector<ListeningSocket> out;
  for (const char* table : {"/net/tcp", "/net/tcp6"}) {
    std::ifstream in(proc + table);
    std::string line;
    std::getline(in, line);  // header
    while (std::getline(in, line)) {
      // sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode ...
      const std::vector<absl::string_view> f = absl::StrSplit(line, ' ', absl::SkipWhitespace());
      ListeningSocket s;
      if (f.size() > 9 && f[3] == "0A" && inodes.contains(f[9]) && ParseProcAddress(f[1], &s)) {
        out.push_back(std::move(s));
      }
    }
  }
  return out;
}

}  // namespace pd::testing
