// Progress display on stderr while a load test runs: a redrawn bar when stderr is a terminal,
// otherwise a plain line every few seconds (logs, CI).
#pragma once

#include <cstdint>
#include <cstdio>
#include <functional>
#include <optional>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace pd::loadtest {

// Counters of a running load test.
struct ProgressSnapshot {
  int64_t sent = 0;
  int64_t completed = 0;  // final status OK
  int64_t failed = 0;     // any other final status
  int64_t in_flight = 0;
  int64_t output_tokens = 0;  // tokens received so far, all requests
  double elapsed_s = 0;
  std::optional<int64_t> total_requests;  // known bound on the request count
  std::optional<double> duration_s;       // time bound
};

enum class ProgressMode { kAuto, kBar, kLines, kOff };

// Parses "auto", "bar", "lines" or "off"; InvalidArgument otherwise.
absl::StatusOr<ProgressMode> ParseProgressMode(absl::string_view text);

// "[#########.........]  45% 450/1000 | 12 in flight | 123.4 req/s | 4.56k tok/s | 0 failed"
// (the bar fills by requests or by time, whichever bound is closer; no bar without a bound).
std::string FormatProgressBar(const ProgressSnapshot& s, int bar_width);
// "progress: 12.0s 450/1000 requests done (0 failed), 12 in flight, 123.4 req/s, 4560 tok/s"
std::string FormatProgressLine(const ProgressSnapshot& s);

// Draws progress on `out` from its own thread until Stop(). Thread-safe.
class ProgressReporter {
 public:
  // kAuto picks kBar when `out` is a terminal, else kLines. `snapshot` is called from the
  // reporter's thread and must be thread-safe.
  ProgressReporter(std::FILE* out, ProgressMode mode, std::function<ProgressSnapshot()> snapshot);
  ~ProgressReporter();  // Stop()s
  ProgressReporter(const ProgressReporter&) = delete;
  ProgressReporter& operator=(const ProgressReporter&) = delete;

  // Draws a last update (the bar is then ended with a newline) and joins the thread.
  // Idempotent.
  void Stop();

 private:
  void Loop();
  void Draw(bool final_update);

  std::FILE* const out_;
  ProgressMode mode_;
  const std::function<ProgressSnapshot()> snapshot_;
  absl::Duration interval_;
  absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace pd::loadtest
