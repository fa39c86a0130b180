// LoadRun: one pd-loadtest invocation end to end — validate the config, load the trace, check
// the target(s) are ready, then run the load and write the reports. main.cc is this plus flags
// and signals; tests drive it in-process. Three shapes:
//
//   single   one run against --target.
//   compare  the same workload against --target (A) and --compare_target (B), interleaved
//            request by request (LoadRunner's compare mode); the report has both summaries and
//            the B / A ratio of each metric.
//   sweep    --request_rates=R1,R2,...: one run per rate, one after the other, each a fresh
//            copy of the same workload (same seed, same requests) with open-loop arrivals at
//            that rate; the report has one summary per rate.
//
// Reports: --output_json and (single runs) --output_csv as before, and with --output_dir the
// directory's summary.json, one records CSV per run (records.csv; records_a.csv and
// records_b.csv; records_rate_<R>.csv) and the plots of plot.h.
//
// Thread-safety: Create and Run from one thread; Stop from any thread (a signal watcher).
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "engine/model/tokenizer.h"
#include "loadtest/load_test_config.h"
#include "loadtest/metrics.h"
#include "loadtest/plot.h"
#include "loadtest/report.h"
#include "loadtest/runner.h"
#include "loadtest/trace.h"
#include "loadtest/workload.h"
#include "pd/v1/generation.pb.h"

namespace pd::loadtest {

// One run's results (one target of a comparison, or one rate of a sweep).
struct TargetRun {
  std::string label;  // "" (single), "A" / "B" (compare), "rate=R" (sweep)
  std::string stem;   // file name part: "run", "a", "b", "rate_R"
  Summary summary;
  RunInfo info;
  std::vector<RequestRecord> records;  // in workload order
};

struct LoadRunOutcome {
  Summary summary;  // of runs[0] (the only run, A, or the first rate)
  RunInfo info;     // of runs[0]
  std::vector<TargetRun> runs;
  std::string table;  // what pd-loadtest prints: the summaries, plus ratios or the sweep table
  // OK, or why a requested report (JSON, CSV, output dir, plot files) could not be written.
  absl::Status report_status;
  std::optional<PlotFiles> plots;  // with --output_dir and --plot
};

class LoadRun {
 public:
  // Errors (all before any load is sent): InvalidArgument for the config or a malformed trace
  // line ("<path>:<line>: ..."), NotFound for a missing trace file, tokenizer or model,
  // Unavailable for an unreachable target or compare target (ProbeTarget, ProbeOpenAiTarget),
  // InvalidArgument when the token range does not fit a model's vocabulary.
  static absl::StatusOr<std::unique_ptr<LoadRun>> Create(const LoadTestConfig& config);

  // Runs the load (every rate of a sweep), then writes the reports (also after Stop: a partial
  // report with "interrupted": true, a sweep keeping the rates already run). Call once.
  LoadRunOutcome Run();

  // Stops issuing and cancels requests in flight; Run then returns the partial outcome (a
  // sweep runs no further rate).
  void Stop();

  const pdserve::v1::ModelInfo& model() const { return model_; }

 private:
  LoadRun() = default;

  absl::StatusOr<std::unique_ptr<Workload>> MakeWorkload() const;
  RunnerOptions RunnerOptionsFor(double request_rate) const;
  // One run of the runner at `request_rate`; appends one TargetRun per target to `runs`.
  // False when stopped.
  bool RunOnce(double request_rate, const std::string& sweep_label, std::vector<TargetRun>* runs);
  void WriteReports(LoadRunOutcome* out) const;

  LoadTestConfig config_;
  pdserve::v1::ModelInfo model_;
  ArrivalMode arrival_ = ArrivalMode::kClosed;
  VocabRange vocab_;
  std::optional<Trace> trace_;  // trace workloads: copied into each run's workload
  std::vector<double> sweep_rates_;
  // How to reach the target [0] and the compare target [1] (compare mode only).
  RunnerTarget targets_[2];
  // The --tokenizer (chat prompts, vocabulary); shared with the runners' OpenAI clients.
  std::shared_ptr<const engine::Tokenizer> tokenizer_;
  RunInfo info_;  // template of each run's RunInfo

  absl::Mutex mu_;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  LoadRunner* current_runner_ ABSL_GUARDED_BY(mu_) = nullptr;
};

}  // namespace pd::loadtest
