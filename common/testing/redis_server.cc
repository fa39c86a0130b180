#include "common/testing/redis_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "common/base/status_macros.h"
#include "common/testing/net.h"
#include "common/testing/subprocess.h"

namespace pd::testing {
namespace {

constexpr int kMaxPortTries = 5;
constexpr absl::Duration kPollInterval = absl::Milliseconds(10);

bool IsExecutable(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(path.c_str(), X_OK) == 0;
}

absl::StatusOr<std::string> FindBinary(const std::string& configured) {
  if (!configured.empty()) {
    if (IsExecutable(configured)) {
      return configured;
    }
    return absl::NotFoundError(
        absl::StrCat("redis-server binary ", configured, " does not exist or is not executable"));
  }
  const char* path_env = std::getenv("PATH");
  if (path_env != nullptr) {
    for (absl::string_view dir : absl::StrSplit(path_env, ':', absl::SkipEmpty())) {
      std::string candidate = absl::StrCat(dir, "/redis-server");
      if (IsExecutable(candidate)) {
        return candidate;
      }
    }
  }
  if (IsExecutable("/usr/bin/redis-server")) {
    return std::string("/usr/bin/redis-server");
  }
  return absl::NotFoundError(
      "redis-server not found on PATH nor at /usr/bin/redis-server (install the redis-server "
      "package)");
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// True when the log, past `offset` (this run's part), says the server is listening.
bool LogHasReadyLine(const std::string& path, off_t offset) {
  const std::string text = ReadFile(path);
  return static_cast<off_t>(text.size()) > offset &&
         absl::StrContains(absl::string_view(text).substr(offset), "Ready to accept connections");
}

}  // namespace

RedisServer::RedisServer(Options options, std::string binary, TempDir dir)
    : options_(std::move(options)), binary_(std::move(binary)), dir_(std::move(dir)) {}

RedisServer::~RedisServer() {
  absl::Status s = Stop();
  (void)s;  // best effort: a destructor has nobody to report to, and Stop() already SIGKILLs
}

absl::StatusOr<std::unique_ptr<RedisServer>> RedisServer::Start(Options options) {
  PD_ASSIGN_OR_RETURN(std::string binary, FindBinary(options.binary));
  PD_ASSIGN_OR_RETURN(TempDir dir, TempDir::Create("pd-redis-"));
  auto server = std::unique_ptr<RedisServer>(
      new RedisServer(std::move(options), std::move(binary), std::move(dir)));
  absl::Status last;
  for (int i = 0; i < kMaxPortTries; ++i) {
    PD_ASSIGN_OR_RETURN(server->port_, PickFreeLoopbackPort());
    bool port_taken = false;
    last = server->Spawn(&port_taken);
    if (last.ok()) {
      return server;
    }
    if (!port_taken) {
      return last;
    }
    // Another process bound the port between PickFreeLoopbackPort and the server's bind.
  }
  return absl::Status(last.code(),
                      absl::StrCat("after ", kMaxPortTries, " ports: ", last.message()));
}

absl::Status RedisServer::Restart() {
  PD_RETURN_IF_ERROR(Stop());
  bool port_taken = false;
  return Spawn(&port_taken);
}

absl::Status RedisServer::Spawn(bool* port_taken) {
  *port_taken = false;
  // The log is appended to across restarts; readiness looks only past this run's offset.
  const off_t log_offset = static_cast<off_t>(ReadFile(log_path()).size());
  // clang-format off
  std::vector<std::string> args = {
      binary_,
      "--port", absl::StrCat(port_),
      "--bind", host_,
      "--protected-mode", "yes",
      "--save", "",
      "--appendonly", "no",
      "--dir", dir_.path(),
      "--daemonize", "no",
  };
  // clang-format on
  if (!options_.password.empty()) {
    args.push_back("--requirepass");
    args.push_back(options_.password);
  }
  args.insert(args.end(), options_.extra_args.begin(), options_.extra_args.end());
  absl::StatusOr<Subprocess> child = Subprocess::Spawn(std::move(args), log_path());
  if (!child.ok()) {
    return absl::InternalError(child.status().message());
  }
  process_ = *std::move(child);

  absl::Status ready = WaitReady(log_offset);
  if (ready.ok()) {
    return ready;
  }
  const std::string log_text = ReadFile(log_path());
  const bool exited = !process_->running();
  (void)process_->Stop(options_.stop_timeout);  // the readiness error is the one to report
  *port_taken =
      exited && static_cast<off_t>(log_text.size()) > log_offset &&
      absl::StrContains(absl::string_view(log_text).substr(log_offset), "Address already in use");
  return absl::UnavailableError(absl::StrCat("redis-server on ", host_, ":", port_, ": ",
                                             ready.message(), "; log tail:\n", LogTail()));
}

absl::Status RedisServer::WaitReady(off_t log_offset) {
  const absl::Time deadline = absl::Now() + options_.start_timeout;
  while (true) {
    if (std::optional<ExitInfo> ended = process_->Poll(); ended.has_value()) {
      return absl::UnavailableError(absl::StrCat(ended->ToString(), " during start-up"));
    }
    // The log line proves that our child (not some other process on the port) is listening.
    if (LogHasReadyLine(log_path(), log_offset) && AnswersPing()) {
      return absl::OkStatus();
    }
    if (absl::Now() >= deadline) {
      return absl::UnavailableError(absl::StrCat("did not answer PING within ",
                                                 absl::FormatDuration(options_.start_timeout)));
    }
    absl::SleepFor(kPollInterval);
  }
}

bool RedisServer::AnswersPing() const {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    return false;
  }
  timeval tv = absl::ToTimeval(absl::Milliseconds(200));
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port_));
  ::inet_pton(AF_INET, host_.c_str(), &addr.sin_addr);
  bool ok = false;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
    static constexpr char kPing[] = "PING\r\n";
    if (::send(fd, kPing, sizeof(kPing) - 1, MSG_NOSIGNAL) == sizeof(kPing) - 1) {
      char buf[64];
      const ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
      if (n > 0) {
        absl::string_view reply(buf, static_cast<size_t>(n));
        ok = absl::StartsWith(reply, "+PONG") || absl::StartsWith(reply, "-NOAUTH");
      }
    }
  }
  ::close(fd);
  return ok;
}

absl::Status RedisServer::Stop() {
  if (!process_.has_value() || !process_->running()) {
    return absl::OkStatus();
  }
  return process_->Stop(options_.stop_timeout).status();
}

std::string RedisServer::LogTail(int max_lines) const {
  const std::string text = ReadFile(log_path());
  std::vector<absl::string_view> lines = absl::StrSplit(text, '\n', absl::SkipEmpty());
  const size_t first = lines.size() > static_cast<size_t>(max_lines)
                           ? lines.size() - static_cast<size_t>(max_lines)
                           : 0;
  return absl::StrJoin(lines.begin() + first, lines.end(), "\n");
}

}  // namespace pd::testing
