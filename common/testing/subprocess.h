// Subprocess: a child process for tests (e2e binaries, redis-server). Test-only.
//
// The child's stdout and stderr go to a log file, stdin is /dev/null, it inherits no other
// descriptors, and it is SIGKILLed if the thread that spawned it dies (PR_SET_PDEATHSIG), so a
// crashed test leaves nothing running; spawn from a thread that outlives the child.
// Thread-compatible.
#pragma once

#include <sys/types.h>

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace pd::testing {

// How a child ended.
struct ExitInfo {
  bool exited = false;  // true: exit code valid; false: killed by signal `signal`
  int code = 0;
  int signal = 0;

  bool Success() const { return exited && code == 0; }
  std::string ToString() const;
};

class Subprocess {
 public:
  // Starts argv[0] (a path) with `argv`. Errors: NotFound when argv[0] is not executable;
  // Internal for fork or log-file failures. The log file is appended to.
  static absl::StatusOr<Subprocess> Spawn(std::vector<std::string> argv, std::string log_path);

  Subprocess(Subprocess&& other) noexcept;
  Subprocess& operator=(Subprocess&& other) noexcept;
  Subprocess(const Subprocess&) = delete;
  Subprocess& operator=(const Subprocess&) = delete;
  // Stops the child (SIGTERM, then SIGKILL after 5 s) if still running.
  ~Subprocess();

  pid_t pid() const { return pid_; }
  bool running() const { return pid_ > 0; }
  const std::string& log_path() const { return log_path_; }

  // Non-blocking: the exit info once the child ended (reaped), nullopt while it runs.
  std::optional<ExitInfo> Poll();
  // Waits up to `timeout` for the child to end. DeadlineExceeded when it is still running.
  absl::StatusOr<ExitInfo> Wait(absl::Duration timeout);
  // Sends `sig`. FailedPrecondition when the child already ended.
  absl::Status Signal(int sig);
  // SIGTERM, wait up to `grace`, then SIGKILL. Returns how it ended; OK if already ended.
  absl::StatusOr<ExitInfo> Stop(absl::Duration grace = absl::Seconds(5));

  // The log file's contents / its last `max_lines` lines.
  std::string ReadLog() const;
  std::string LogTail(int max_lines = 20) const;

 private:
  Subprocess(pid_t pid, std::string log_path) : pid_(pid), log_path_(std::move(log_path)) {}

  pid_t pid_ = -1;
  std::optional<ExitInfo> exit_;
  std::string log_path_;
};

}  // namespace pd::testing
