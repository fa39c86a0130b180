#include "common/testing/subprocess.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace pd::testing {
namespace {

ExitInfo FromWaitStatus(int wstatus) {
  ExitInfo info;
  if (WIFEXITED(wstatus)) {
    info.exited = true;
    info.code = WEXITSTATUS(wstatus);
  } else if (WIFSIGNALED(wstatus)) {
    info.signal = WTERMSIG(wstatus);
  }
  return info;
}

}  // namespace

std::string ExitInfo::ToString() const {
  return exited ? absl::StrCat("exit code ", code) : absl::StrCat("killed by signal ", signal);
}

absl::StatusOr<Subprocess> Subprocess::Spawn(std::vector<std::string> argv,
                                             std::string log_path) {
  if (argv.empty() || ::access(argv[0].c_str(), X_OK) != 0) {
    return absl::NotFoundError(
        absl::StrCat("not an executable: ", argv.empty() ? "(empty argv)" : argv[0]));
  }
  const int log_fd = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (log_fd < 0) {
    return absl::InternalError(absl::StrCat("open ", log_path, ": ", std::strerror(errno)));
  }
  // Built before fork: the child may only make async-signal-safe calls.
  std::vector<char*> cargv;
  for (std::string& a : argv) {
    cargv.push_back(a.data());
  }
  cargv.push_back(nullptr);
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) {
    const int err = errno;
    ::close(log_fd);
    return absl::InternalError(absl::StrCat("fork: ", std::strerror(err)));
  }
  if (pid == 0) {
    // Die with the parent; if it already died, getppid() changed and we stop here.
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) {
      ::_exit(127);
    }
    // Signals blocked by the test (e.g. a ShutdownSignal) must not stay blocked in the child.
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    ::dup2(log_fd, STDOUT_FILENO);
    ::dup2(log_fd, STDERR_FILENO);
    const int null_fd = ::open("/dev/null", O_RDONLY);
    if (null_fd >= 0) {
      ::dup2(null_fd, STDIN_FILENO);
    }
    ::close_range(3, ~0U, 0);  // no inherited descriptors (test sockets, files)
    ::execv(cargv[0], cargv.data());
    ::_exit(127);
  }
  ::close(log_fd);
  return Subprocess(pid, std::move(log_path));
}

Subprocess::Subprocess(Subprocess&& other) noexcept
    : pid_(other.pid_), exit_(other.exit_), log_path_(std::move(other.log_path_)) {
  other.pid_ = -1;
}

Subprocess& Subprocess::operator=(Subprocess&& other) noexcept {
  if (this != &other) {
    if (running()) {
      (void)Stop();
    }
    pid_ = other.pid_;
    exit_ = other.exit_;
    log_path_ = std::move(other.log_path_);
    other.pid_ = -1;
  }
  return *this;
}

Subprocess::~Subprocess() {
  if (running()) {
    (void)Stop();
  }
}

std::optional<ExitInfo> Subprocess::Poll() {
  if (pid_ <= 0) {
    return exit_;
  }
  int wstatus = 0;
  pid_t r;
  do {
    r = ::waitpid(pid_, &wstatus, WNOHANG);
  } while (r < 0 && errno == EINTR);
  if (r == pid_) {
    exit_ = FromWaitStatus(wstatus);
    pid_ = -1;
  }
  return exit_;
}

absl::StatusOr<ExitInfo> Subprocess::Wait(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (true) {
    if (std::optional<ExitInfo> info = Poll(); info.has_value()) {
      return *info;
    }
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          "pid ", pid_, " still running after ", absl::FormatDuration(timeout)));
    }
    absl::SleepFor(absl::Milliseconds(5));
  }
}

absl::Status Subprocess::Signal(int sig) {
  if (!running()) {
    return absl::FailedPreconditionError("process already ended");
  }
  if (::kill(pid_, sig) != 0) {
    return absl::InternalError(absl::StrCat("kill ", pid_, ": ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

absl::StatusOr<ExitInfo> Subprocess::Stop(absl::Duration grace) {
  if (!running()) {
    return exit_.value_or(ExitInfo{});
  }
  ::kill(pid_, SIGTERM);
  absl::StatusOr<ExitInfo> info = Wait(grace);
  if (info.ok()) {
    return info;
  }
  ::kill(pid_, SIGKILL);
  return Wait(absl::Seconds(10));
}

std::string Subprocess::ReadLog() const {
  std::ifstream in(log_path_, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string Subprocess::LogTail(int max_lines) const {
  const std::string text = ReadLog();
  std::vector<absl::string_view> lines = absl::StrSplit(text, '\n', absl::SkipEmpty());
  const size_t first =
      lines.size() > static_cast<size_t>(max_lines) ? lines.size() - max_lines : 0;
  return absl::StrJoin(lines.begin() + first, lines.end(), "\n");
}

}  // namespace pd::testing
