// RedisServer: a real `redis-server` child process on a free 127.0.0.1 port, for integration and
// e2e tests. Test-only: linked by tests, never by binaries.
//
//   PD_ASSIGN_OR_RETURN(std::unique_ptr<RedisServer> server, RedisServer::Start({}));
//   config.port = server->port();
//
// The server keeps nothing on disk (`--save "" --appendonly no`, working directory in a TempDir
// removed with the fixture) and listens on loopback only. Its stdout and stderr go to log_path();
// start failures quote the log's tail.
//
// Lifetime: the destructor stops the server. The child is also killed (SIGKILL) if the thread
// that started it exits or the test process dies (PR_SET_PDEATHSIG), so nothing outlives a
// crashed test; hence Start() and Restart() must be called from a thread that outlives the
// server (the test's main thread).
//
// Thread-compatible: one thread drives a RedisServer.
#pragma once

#include <sys/types.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/testing/subprocess.h"
#include "common/testing/temp_dir.h"

namespace pd::testing {

class RedisServer {
 public:
  struct Options {
    // Non-empty: started with `--requirepass password`.
    std::string password;
    // Path of redis-server; empty: the first `redis-server` on PATH, else /usr/bin/redis-server.
    std::string binary;
    // Appended to the command line, e.g. {"--maxmemory", "1mb"}.
    std::vector<std::string> extra_args;
    // Bound on waiting for the server to answer PING, per start.
    absl::Duration start_timeout = absl::Seconds(5);
    // Bound on waiting after SIGTERM before SIGKILL.
    absl::Duration stop_timeout = absl::Seconds(2);
  };

  // Finds the binary, picks a free loopback port (another if the port is taken before the
  // server binds it, up to 5 ports) and waits until the server answers PING.
  // Errors: NotFound (no redis-server), Internal (fork, temp dir, log file), Unavailable (the
  // server exited or did not answer in time; the message has the log tail).
  static absl::StatusOr<std::unique_ptr<RedisServer>> Start(Options options);

  RedisServer(const RedisServer&) = delete;
  RedisServer& operator=(const RedisServer&) = delete;
  ~RedisServer();

  // SIGTERM, then SIGKILL after options.stop_timeout; reaps the child. OK when not running.
  // Errors: DeadlineExceeded when even SIGKILL did not end it in time.
  absl::Status Stop();

  // Stop() then start again on the same port (data is lost: nothing is persisted).
  // Errors: as Start(); no other port is tried.
  absl::Status Restart();

  bool running() const { return process_.has_value() && process_->running(); }
  int port() const { return port_; }
  const std::string& host() const { return host_; }
  const std::string& password() const { return options_.password; }
  std::string log_path() const { return dir_.File("redis.log"); }
  // The last `max_lines` lines of the server log, for failure messages.
  std::string LogTail(int max_lines = 20) const;

 private:
  RedisServer(Options options, std::string binary, TempDir dir);

  // Forks and execs the server on port_, then waits for PING. Unavailable with the log tail on
  // failure; `*port_taken` is set when the server exited because the port was in use.
  absl::Status Spawn(bool* port_taken);
  // Polls until the log past `log_offset` has "Ready to accept connections" and PING answers.
  absl::Status WaitReady(off_t log_offset);
  // True when something on port_ answers PING (or NOAUTH, which also proves it is serving).
  bool AnswersPing() const;

  const Options options_;
  const std::string binary_;
  const std::string host_ = "127.0.0.1";
  TempDir dir_;
  int port_ = 0;
  std::optional<Subprocess> process_;
};

}  // namespace pd::testing
