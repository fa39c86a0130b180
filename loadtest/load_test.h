// LoadTest: one pd-loadtest run end to end — validate the config, load the trace, check the
// target is ready, build the workload and the runner, run with a progress display, and write
// the reports. main.cc is this plus flags and signals; tests drive it in-process.
//
// Thread-safety: Create and Run from one thread; Stop from any thread (a signal watcher).
#pragma once

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "loadtest/load_test_config.h"
#include "loadtest/metrics.h"
#include "loadtest/report.h"
#include "loadtest/runner.h"
#include "loadtest/workload.h"
#include "pd/v1/generation.pb.h"

namespace pd::loadtest {

struct LoadTestOutcome {
  Summary summary;
  RunInfo info;
  std::string table;  // SummaryTable(summary, info)
  // OK, or why a requested report (JSON/CSV) could not be written.
  absl::Status report_status;
};

class LoadTest {
 public:
  // Errors (all before any load is sent): InvalidArgument for the config or a malformed trace
  // line ("<path>:<line>: ..."), NotFound for a missing trace file or model, Unavailable for an
  // unreachable target (ProbeTarget), InvalidArgument when the token range does not fit the
  // model's vocabulary.
  static absl::StatusOr<std::unique_ptr<LoadTest>> Create(const LoadTestConfig& config);

  // Runs the load, then writes --output_json / --output_csv (also after Stop: a partial
  // report with "interrupted": true). Call once.
  LoadTestOutcome Run();

  // Stops issuing and cancels requests in flight; Run then returns the partial outcome.
  void Stop() { runner_->Stop(); }

  const pdserve::v1::ModelInfo& model() const { return model_; }

 private:
  LoadTest() = default;

  LoadTestConfig config_;
  pdserve::v1::ModelInfo model_;
  std::unique_ptr<Workload> workload_;
  std::unique_ptr<LoadRunner> runner_;
  RunInfo info_;
};

}  // namespace pd::loadtest
