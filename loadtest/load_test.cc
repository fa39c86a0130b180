#include "loadtest/load_test.h"

#include <cstdio>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/base/status_macros.h"
#include "common/log/log.h"
#include "loadtest/length_spec.h"
#include "loadtest/progress.h"
#include "loadtest/target.h"
#include "loadtest/trace.h"

namespace pd::loadtest {
namespace {

// Warns when requests do not fit the model's context window: a prompt of max_context_tokens or
// more is rejected (INVALID_ARGUMENT, counted as an error); a longer prompt + output is cut
// short at the window (finish reason LENGTH, counted in short_outputs).
void WarnAboutContext(int64_t longest_prompt, int64_t longest_request,
                      uint32_t max_context_tokens) {
  const int64_t context = max_context_tokens;
  if (context == 0) {
    return;
  }
  if (longest_prompt >= context) {
    LOG(WARNING) << "prompts of up to " << longest_prompt << " tokens but the model's context is "
                 << context << " tokens: the server will reject the longer ones (use "
                 << "--max_input_len or shorter lengths)";
  } else if (longest_request > context) {
    LOG(WARNING) << "requests of up to " << longest_request << " tokens (prompt + output) but the "
                 << "model's context is " << context << " tokens: their output will be cut short";
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<LoadTest>> LoadTest::Create(const LoadTestConfig& config) {
  PD_RETURN_IF_ERROR(config.Validate());
  std::unique_ptr<LoadTest> lt(new LoadTest());
  lt->config_ = config;
  const std::string workload = config.WorkloadName();
  PD_ASSIGN_OR_RETURN(const ArrivalMode arrival, config.ResolveArrival());
  PD_ASSIGN_OR_RETURN(const LengthSpec input_len, LengthSpec::Parse(config.input_len));
  PD_ASSIGN_OR_RETURN(const LengthSpec output_len, LengthSpec::Parse(config.output_len));

  // Input errors first: they need no server.
  std::optional<Trace> trace;
  if (workload == "trace") {
    TraceOptions options;
    options.time_scale = config.time_scale;
    options.max_input_len = config.max_input_len;
    options.block_tokens = config.trace_block_tokens;
    PD_ASSIGN_OR_RETURN(options.on_bad_line, ParseBadLinePolicy(config.on_bad_line));
    PD_ASSIGN_OR_RETURN(trace, LoadTrace(config.trace, options));
    for (size_t i = 0; i < trace->skipped.size() && i < 10; ++i) {
      LOG(WARNING) << "skipped " << trace->skipped[i];
    }
    if (trace->skipped.size() > 10) {
      LOG(WARNING) << "skipped " << trace->skipped.size() - 10 << " more malformed lines";
    }
  }

  std::vector<std::shared_ptr<grpc::Channel>> channels =
      MakeChannels(config.target, config.num_channels);
  PD_ASSIGN_OR_RETURN(
      lt->model_, ProbeTarget(channels[0], config.target, config.model, config.connect_timeout));
  VocabRange vocab{config.vocab_lo, config.vocab_size};
  if (vocab.hi == 0) {
    vocab.hi = lt->model_.vocab_size();
    if (vocab.hi == 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "target ", config.target, " does not report the model's vocab_size: pass --vocab_size"));
    }
  } else if (lt->model_.vocab_size() > 0 && vocab.hi > lt->model_.vocab_size()) {
    return absl::InvalidArgumentError(absl::StrCat("--vocab_size ", vocab.hi, " exceeds model '",
                                                   lt->model_.id(), "' vocab_size ",
                                                   lt->model_.vocab_size()));
  }
  if (vocab.lo >= vocab.hi) {
    return absl::InvalidArgumentError(
        absl::StrCat("--vocab_lo ", vocab.lo, " must be < the vocabulary size ", vocab.hi));
  }

  RunInfo& info = lt->info_;
  info.target = config.target;
  info.model = lt->model_.id();
  info.workload = workload;
  info.arrival = std::string(ArrivalModeName(arrival));
  info.concurrency = config.concurrency;
  info.request_rate = config.request_rate;
  info.burstiness = config.burstiness;
  info.seed = config.seed;
  info.num_requests = config.num_requests;
  info.duration_bound_s = absl::ToDoubleSeconds(config.duration);
  info.workload_options.push_back({"vocab", absl::StrCat("[", vocab.lo, ",", vocab.hi, ")")});
  if (workload == "synthetic") {
    SyntheticOptions o{input_len, output_len, vocab, config.seed};
    PD_ASSIGN_OR_RETURN(lt->workload_, MakeSyntheticWorkload(o));
    WarnAboutContext(input_len.max(), input_len.max() + output_len.max(),
                     lt->model_.max_context_tokens());
    info.workload_options.push_back({"input_len", input_len.ToString()});
    info.workload_options.push_back({"output_len", output_len.ToString()});
  } else if (workload == "shared_prefix") {
    SharedPrefixOptions o{config.num_prefixes, config.suffixes_per_prefix,
                          config.prefix_len,   config.suffix_len,
                          output_len,          vocab,
                          config.seed};
    PD_ASSIGN_OR_RETURN(lt->workload_, MakeSharedPrefixWorkload(o));
    WarnAboutContext(config.prefix_len + config.suffix_len,
                     config.prefix_len + config.suffix_len + output_len.max(),
                     lt->model_.max_context_tokens());
    info.workload_options.push_back({"num_prefixes", absl::StrCat(config.num_prefixes)});
    info.workload_options.push_back(
        {"suffixes_per_prefix", absl::StrCat(config.suffixes_per_prefix)});
    info.workload_options.push_back({"prefix_len", absl::StrCat(config.prefix_len)});
    info.workload_options.push_back({"suffix_len", absl::StrCat(config.suffix_len)});
    info.workload_options.push_back({"output_len", output_len.ToString()});
  } else {
    int64_t longest_prompt = 0;
    int64_t longest = 0;
    const size_t sent = config.num_requests > 0 ? std::min(trace->records.size(),
                                                           static_cast<size_t>(config.num_requests))
                                                : trace->records.size();
    for (size_t i = 0; i < sent; ++i) {
      const TraceRecord& r = trace->records[i];
      longest_prompt = std::max(longest_prompt, r.input_length);
      longest = std::max(longest, r.input_length + r.output_length);
    }
    WarnAboutContext(longest_prompt, longest, lt->model_.max_context_tokens());
    info.workload_options.push_back({"trace", config.trace});
    info.workload_options.push_back({"time_scale", absl::StrCat(config.time_scale)});
    info.workload_options.push_back({"max_input_len", absl::StrCat(config.max_input_len)});
    info.workload_options.push_back({"trace_records", absl::StrCat(trace->records.size())});
    info.workload_options.push_back({"trace_skipped_lines", absl::StrCat(trace->skipped.size())});
    info.workload_options.push_back({"trace_capped_requests", absl::StrCat(trace->num_capped)});
    PD_ASSIGN_OR_RETURN(lt->workload_,
                        MakeTraceWorkload(*std::move(trace), {config.trace_block_tokens, vocab}));
  }

  RunnerOptions ro;
  ro.model = config.model;
  ro.arrival = arrival;
  ro.concurrency = config.concurrency;
  ro.request_rate = config.request_rate;
  ro.burstiness = config.burstiness;
  // A different stream from the workload's, so changing one does not shift the other.
  ro.seed = config.seed ^ 0x5eed'a771'7a15'0000ULL;
  ro.num_requests = config.num_requests;
  ro.duration = config.duration;
  ro.request_timeout = config.request_timeout;
  ro.ignore_eos = config.ignore_eos;
  ro.cache_salt = config.cache_salt;
  ro.num_threads = config.client_threads;
  PD_ASSIGN_OR_RETURN(lt->runner_, LoadRunner::Create(ro, std::move(channels)));
  LOG(INFO) << "pd-loadtest: target " << config.target << " model '" << lt->model_.id()
            << "' (vocab " << lt->model_.vocab_size() << ", context "
            << lt->model_.max_context_tokens() << "), workload " << workload << ", arrival "
            << info.arrival << ", concurrency " << config.concurrency << ", rate "
            << config.request_rate << "/s, num_requests " << config.num_requests << ", duration "
            << absl::FormatDuration(config.duration);
  return lt;
}

LoadTestOutcome LoadTest::Run() {
  absl::StatusOr<ProgressMode> mode = ParseProgressMode(config_.progress);
  info_.started_at = absl::FormatTime(absl::RFC3339_sec, absl::Now(), absl::UTCTimeZone());
  RunResult result;
  {
    ProgressReporter progress(stderr, mode.value_or(ProgressMode::kOff),
                              [this] { return runner_->Progress(); });
    result = runner_->Run(workload_.get());
  }
  Slo slo;
  if (config_.slo_ttft_ms > 0) {
    slo.ttft_ms = config_.slo_ttft_ms;
  }
  if (config_.slo_tpot_ms > 0) {
    slo.tpot_ms = config_.slo_tpot_ms;
  }
  LoadTestOutcome out;
  out.summary = Summarize(result.records, result.duration_ns, slo);
  info_.interrupted = result.stopped;
  info_.max_in_flight = result.max_in_flight;
  out.info = info_;
  out.table = SummaryTable(out.summary, out.info);
  if (!config_.output_json.empty()) {
    out.report_status.Update(WriteFile(config_.output_json, SummaryJson(out.summary, out.info)));
  }
  if (!config_.output_csv.empty()) {
    out.report_status.Update(WriteFile(config_.output_csv, RecordsCsv(result.records)));
  }
  return out;
}

}  // namespace pd::loadtest
