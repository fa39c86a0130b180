// PeerControl: spawns transport_conformance_peer (peer_main.cc) and drives it over a one-line
// text protocol on a 127.0.0.1 control socket. Used by the two-process conformance tests and
// by pd-kvbench. Not for production binaries. Thread-compatible.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/testing/subprocess.h"

namespace pd::transport::conformance {

class PeerControl {
 public:
  // Starts `binary` with `args` plus --control=<our socket>, waits up to `timeout` for it to
  // connect back. The child's output goes to `log_path`.
  static absl::StatusOr<std::unique_ptr<PeerControl>> Start(const std::string& binary,
                                                            std::vector<std::string> args,
                                                            const std::string& log_path,
                                                            absl::Duration timeout);
  ~PeerControl();

  // Sends one command line; returns the reply without the leading "ok " (or "ok").
  // Errors: Internal with the peer's "err ..." text or its log tail; DeadlineExceeded.
  absl::StatusOr<std::string> Call(const std::string& line,
                                   absl::Duration timeout = absl::Seconds(30));
  testing::Subprocess& process() { return *process_; }

 private:
  PeerControl() = default;
  std::optional<testing::Subprocess> process_;
  int fd_ = -1;
  std::string buf_;
};

}  // namespace pd::transport::conformance
