#include "loadtest/load_run.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <system_error>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/base/status_macros.h"
#include "common/log/log.h"
#include "engine/model/hf_tokenizer.h"
#include "engine/model/llama2c_tokenizer.h"
#include "loadtest/length_spec.h"
#include "loadtest/progress.h"
#include "loadtest/target.h"
#include "services/base/auth.h"
#include "services/base/grpc_security.h"

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

// The vocabulary range: --vocab_size, or the smallest of the targets' models.
absl::StatusOr<VocabRange> ResolveVocab(const LoadTestConfig& config,
                                        const std::vector<pdserve::v1::ModelInfo>& models) {
  VocabRange vocab{config.vocab_lo, config.vocab_size};
  for (size_t i = 0; i < models.size(); ++i) {
    const pdserve::v1::ModelInfo& m = models[i];
    const std::string& target = i == 0 ? config.target : config.compare_target;
    if (config.vocab_size == 0) {
      if (m.vocab_size() == 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "target ", target, " does not report the model's vocab_size: pass --vocab_size",
            config.BackendOf(static_cast<int>(i)) == "openai"
                ? " or --tokenizer (OpenAI servers do not report it)"
                : ""));
      }
      vocab.hi = vocab.hi == 0 ? m.vocab_size() : std::min(vocab.hi, m.vocab_size());
    } else if (m.vocab_size() > 0 && vocab.hi > m.vocab_size()) {
      return absl::InvalidArgumentError(absl::StrCat("--vocab_size ", vocab.hi, " exceeds model '",
                                                     m.id(), "' vocab_size ", m.vocab_size(),
                                                     " at ", target));
    }
  }
  if (vocab.lo >= vocab.hi) {
    return absl::InvalidArgumentError(
        absl::StrCat("--vocab_lo ", vocab.lo, " must be < the vocabulary size ", vocab.hi));
  }
  return vocab;
}

// --tokenizer: a tokenizer.json, a directory holding one, or a llama2.c tokenizer.bin (whose
// size is --vocab_size).
absl::StatusOr<std::shared_ptr<const engine::Tokenizer>> LoadTokenizer(const std::string& path,
                                                                       uint32_t vocab_size) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    PD_ASSIGN_OR_RETURN(engine::HfTokenizer t,
                        engine::HfTokenizer::Load(absl::StrCat(path, "/tokenizer.json")));
    return std::make_shared<const engine::HfTokenizer>(std::move(t));
  }
  if (!std::filesystem::exists(path, ec)) {
    return absl::NotFoundError(absl::StrCat("--tokenizer '", path, "' does not exist"));
  }
  if (absl::EndsWith(path, ".json")) {
    PD_ASSIGN_OR_RETURN(engine::HfTokenizer t, engine::HfTokenizer::Load(path));
    return std::make_shared<const engine::HfTokenizer>(std::move(t));
  }
  if (vocab_size == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--tokenizer '", path, "' is a llama2.c tokenizer.bin: pass its size with --vocab_size"));
  }
  PD_ASSIGN_OR_RETURN(engine::Llama2cTokenizer t, engine::Llama2cTokenizer::Load(path, vocab_size));
  return std::make_shared<const engine::Llama2cTokenizer>(std::move(t));
}

// What an OpenAI server's model list tells: the id and, from vLLM, the context length; the
// vocabulary comes from the tokenizer when there is one.
pdserve::v1::ModelInfo ModelInfoOf(const OpenAiModel& m, const engine::Tokenizer* tokenizer) {
  pdserve::v1::ModelInfo info;
  info.set_id(m.id);
  info.set_max_context_tokens(static_cast<uint32_t>(std::max<int64_t>(m.max_model_len, 0)));
  if (tokenizer != nullptr) {
    info.set_vocab_size(tokenizer->vocab_size());
  }
  return info;
}

std::string CsvName(const TargetRun& run) {
  return run.stem == "run" ? "records.csv" : absl::StrCat("records_", run.stem, ".csv");
}

}  // namespace

absl::StatusOr<std::unique_ptr<LoadRun>> LoadRun::Create(const LoadTestConfig& config) {
  PD_RETURN_IF_ERROR(config.Validate());
  std::unique_ptr<LoadRun> lt(new LoadRun());
  lt->config_ = config;
  const std::string workload = config.WorkloadName();
  PD_ASSIGN_OR_RETURN(lt->arrival_, config.ResolveArrival());
  PD_ASSIGN_OR_RETURN(lt->sweep_rates_, config.SweepRates());
  PD_ASSIGN_OR_RETURN(const LengthSpec input_len, LengthSpec::Parse(config.input_len));
  PD_ASSIGN_OR_RETURN(const LengthSpec output_len, LengthSpec::Parse(config.output_len));

  // Input errors first: they need no server.
  if (workload == "trace") {
    TraceOptions options;
    options.time_scale = config.time_scale;
    options.max_input_len = config.max_input_len;
    options.block_tokens = config.trace_block_tokens;
    PD_ASSIGN_OR_RETURN(options.on_bad_line, ParseBadLinePolicy(config.on_bad_line));
    PD_ASSIGN_OR_RETURN(lt->trace_, LoadTrace(config.trace, options));
    for (size_t i = 0; i < lt->trace_->skipped.size() && i < 10; ++i) {
      LOG(WARNING) << "skipped " << lt->trace_->skipped[i];
    }
    if (lt->trace_->skipped.size() > 10) {
      LOG(WARNING) << "skipped " << lt->trace_->skipped.size() - 10 << " more malformed lines";
    }
  }

  if (!config.tokenizer.empty()) {
    PD_ASSIGN_OR_RETURN(lt->tokenizer_, LoadTokenizer(config.tokenizer, config.vocab_size));
  }
  std::string api_key;
  if (!config.api_key_file.empty()) {
    // pdserve's keys are at least kMinKeyBytes long; other servers' may be shorter.
    const bool any_grpc =
        config.BackendOf(0) == "grpc" || (config.compare() && config.BackendOf(1) == "grpc");
    PD_ASSIGN_OR_RETURN(
        api_key, services::ReadSecretFile(config.api_key_file, "--api_key_file",
                                          any_grpc ? services::ApiKeyStore::kMinKeyBytes : 1));
  }
  std::shared_ptr<const services::ClientSecurity> security;
  std::vector<pdserve::v1::ModelInfo> models;
  for (int t = 0; t < (config.compare() ? 2 : 1); ++t) {
    const std::string& address = t == 0 ? config.target : config.compare_target;
    RunnerTarget& target = lt->targets_[t];
    if (config.BackendOf(t) == "grpc") {
      if (security == nullptr) {
        std::vector<services::CallHeader> headers;
        if (!api_key.empty()) {
          headers.push_back(services::BearerHeader(api_key));
        }
        PD_ASSIGN_OR_RETURN(
            security, services::ClientSecurity::Create(
                          {config.tls_ca, config.tls_cert, config.tls_key}, headers, "--tls_"));
      }
      target.backend = Backend::kGrpc;
      target.channels = MakeChannels(address, config.num_channels, security);
      PD_ASSIGN_OR_RETURN(
          pdserve::v1::ModelInfo model,
          ProbeTarget(target.channels[0], address, config.model, config.connect_timeout));
      models.push_back(std::move(model));
      continue;
    }
    target.backend = Backend::kOpenAi;
    OpenAiClientOptions& o = target.openai;
    o.url = address;
    PD_ASSIGN_OR_RETURN(o.endpoint, ParseOpenAiEndpoint(t == 0 ? "endpoint" : "compare_endpoint",
                                                        config.EndpointOf(t)));
    o.api_key = api_key;
    o.tls_ca = config.tls_ca;
    o.tokenizer = lt->tokenizer_;
    o.connect_timeout = config.connect_timeout;
    // The salt is an extension some servers reject: sent only when the user set one.
    target.openai_cache_salt = !config.cache_salt.empty();
    PD_ASSIGN_OR_RETURN(const OpenAiModel model, ProbeOpenAiTarget(o, config.model));
    o.model = model.id;
    models.push_back(ModelInfoOf(model, lt->tokenizer_.get()));
  }
  lt->model_ = models[0];
  PD_ASSIGN_OR_RETURN(lt->vocab_, ResolveVocab(config, models));
  const VocabRange vocab = lt->vocab_;

  RunInfo& info = lt->info_;
  info.target = config.target;
  info.model = lt->model_.id();
  info.workload = workload;
  info.arrival = std::string(ArrivalModeName(lt->arrival_));
  info.concurrency = config.concurrency;
  info.request_rate = config.request_rate;
  info.burstiness = config.burstiness;
  info.seed = config.seed;
  info.num_requests = config.num_requests;
  info.duration_bound_s = absl::ToDoubleSeconds(config.duration);
  info.workload_options.push_back({"vocab", absl::StrCat("[", vocab.lo, ",", vocab.hi, ")")});
  const uint32_t context = lt->model_.max_context_tokens();
  if (workload == "synthetic") {
    WarnAboutContext(input_len.max(), input_len.max() + output_len.max(), context);
    info.workload_options.push_back({"input_len", input_len.ToString()});
    info.workload_options.push_back({"output_len", output_len.ToString()});
  } else if (workload == "shared_prefix") {
    WarnAboutContext(config.prefix_len + config.suffix_len,
                     config.prefix_len + config.suffix_len + output_len.max(), context);
    info.workload_options.push_back({"num_prefixes", absl::StrCat(config.num_prefixes)});
    info.workload_options.push_back(
        {"suffixes_per_prefix", absl::StrCat(config.suffixes_per_prefix)});
    info.workload_options.push_back({"prefix_len", absl::StrCat(config.prefix_len)});
    info.workload_options.push_back({"suffix_len", absl::StrCat(config.suffix_len)});
    info.workload_options.push_back({"output_len", output_len.ToString()});
  } else if (workload == "multi_turn") {
    PD_ASSIGN_OR_RETURN(const LengthSpec user_len, LengthSpec::Parse(config.user_len));
    // The longest prompt: every turn at its longest, unless the cap ends conversations sooner.
    int64_t longest_prompt = config.system_prompt_len + config.num_turns * user_len.max() +
                             (config.num_turns - 1) * output_len.max();
    if (config.max_input_len > 0) {
      longest_prompt = std::min(longest_prompt, config.max_input_len);
    }
    WarnAboutContext(longest_prompt, longest_prompt + output_len.max(), context);
    info.workload_options.push_back({"num_conversations", absl::StrCat(config.num_conversations)});
    info.workload_options.push_back({"num_turns", absl::StrCat(config.num_turns)});
    info.workload_options.push_back({"system_prompt_len", absl::StrCat(config.system_prompt_len)});
    info.workload_options.push_back({"user_len", user_len.ToString()});
    info.workload_options.push_back({"output_len", output_len.ToString()});
    info.workload_options.push_back({"max_input_len", absl::StrCat(config.max_input_len)});
  } else {
    const Trace& trace = *lt->trace_;
    int64_t longest_prompt = 0;
    int64_t longest = 0;
    const size_t sent = config.num_requests > 0 ? std::min(trace.records.size(),
                                                           static_cast<size_t>(config.num_requests))
                                                : trace.records.size();
    for (size_t i = 0; i < sent; ++i) {
      const TraceRecord& r = trace.records[i];
      longest_prompt = std::max(longest_prompt, r.input_length);
      longest = std::max(longest, r.input_length + r.output_length);
    }
    WarnAboutContext(longest_prompt, longest, context);
    info.workload_options.push_back({"trace", config.trace});
    info.workload_options.push_back({"time_scale", absl::StrCat(config.time_scale)});
    info.workload_options.push_back({"max_input_len", absl::StrCat(config.max_input_len)});
    info.workload_options.push_back({"trace_records", absl::StrCat(trace.records.size())});
    info.workload_options.push_back({"trace_skipped_lines", absl::StrCat(trace.skipped.size())});
    info.workload_options.push_back({"trace_capped_requests", absl::StrCat(trace.num_capped)});
  }
  const auto add_backend = [&](int t, const char* prefix) {
    info.workload_options.push_back({absl::StrCat(prefix, "backend"), config.BackendOf(t)});
    if (config.BackendOf(t) == "openai") {
      info.workload_options.push_back({absl::StrCat(prefix, "endpoint"), config.EndpointOf(t)});
    }
  };
  add_backend(0, "");
  if (config.compare()) {
    info.workload_options.push_back({"compare_target", config.compare_target});
    add_backend(1, "compare_");
  }
  if (!config.json_schema_file.empty()) {
    info.workload_options.push_back({"json_schema", config.json_schema_file});
  }
  if (config.temperature != 0) {
    info.workload_options.push_back({"temperature", absl::StrCat(config.temperature)});
  }
  const SamplingPenalties& pen = config.penalties;
  for (const auto& [name, value] :
       {std::pair<const char*, double>{"presence_penalty", pen.presence_penalty},
        {"frequency_penalty", pen.frequency_penalty},
        {"repetition_penalty", pen.repetition_penalty},
        {"min_p", pen.min_p}}) {
    if (value != 0) info.workload_options.push_back({name, absl::StrCat(value)});
  }
  // Everything a run needs is checked now, not at the first (or a later) rate.
  PD_RETURN_IF_ERROR(lt->MakeWorkload().status());
  for (double rate :
       lt->sweep_rates_.empty() ? std::vector<double>{config.request_rate} : lt->sweep_rates_) {
    PD_RETURN_IF_ERROR(lt->RunnerOptionsFor(rate).Validate());
  }
  LOG(INFO) << "pd-loadtest: target " << config.target
            << (config.compare() ? absl::StrCat(" vs ", config.compare_target) : "") << " model '"
            << lt->model_.id() << "' (vocab " << lt->model_.vocab_size() << ", context " << context
            << "), workload " << workload << ", arrival " << info.arrival << ", concurrency "
            << config.concurrency << ", rate "
            << (config.request_rates.empty() ? absl::StrCat(config.request_rate)
                                             : config.request_rates)
            << "/s, num_requests " << config.num_requests << ", duration "
            << absl::FormatDuration(config.duration);
  return lt;
}

absl::StatusOr<std::unique_ptr<Workload>> LoadRun::MakeWorkload() const {
  PD_ASSIGN_OR_RETURN(const LengthSpec input_len, LengthSpec::Parse(config_.input_len));
  PD_ASSIGN_OR_RETURN(const LengthSpec output_len, LengthSpec::Parse(config_.output_len));
  const std::string workload = config_.WorkloadName();
  if (workload == "synthetic") {
    return MakeSyntheticWorkload({input_len, output_len, vocab_, config_.seed});
  }
  if (workload == "shared_prefix") {
    return MakeSharedPrefixWorkload({config_.num_prefixes, config_.suffixes_per_prefix,
                                     config_.prefix_len, config_.suffix_len, output_len, vocab_,
                                     config_.seed});
  }
  if (workload == "multi_turn") {
    MultiTurnOptions o;
    o.num_conversations = config_.num_conversations;
    o.num_turns = config_.num_turns;
    o.system_prompt_len = config_.system_prompt_len;
    PD_ASSIGN_OR_RETURN(o.user_len, LengthSpec::Parse(config_.user_len));
    o.output_len = output_len;
    o.max_prompt_len = config_.max_input_len;
    o.vocab = vocab_;
    o.seed = config_.seed;
    return MakeMultiTurnWorkload(o);
  }
  return MakeTraceWorkload(*trace_, {config_.trace_block_tokens, vocab_});
}

RunnerOptions LoadRun::RunnerOptionsFor(double request_rate) const {
  RunnerOptions ro;
  ro.model = config_.model;
  ro.arrival = arrival_;
  ro.concurrency = config_.concurrency;
  ro.request_rate = request_rate;
  ro.burstiness = config_.burstiness;
  // A different stream from the workload's, so changing one does not shift the other.
  ro.seed = config_.seed ^ 0x5eed'a771'7a15'0000ULL;
  ro.num_requests = config_.num_requests;
  ro.duration = config_.duration;
  ro.request_timeout = config_.request_timeout;
  ro.ignore_eos = config_.ignore_eos;
  ro.temperature = config_.temperature;
  ro.penalties = config_.penalties;
  ro.cache_salt = config_.cache_salt;
  ro.json_schema = config_.json_schema;
  if (config_.compare() && config_.compare_salt) {
    ro.cache_salt = absl::StrCat(config_.cache_salt, "/a");
    ro.compare_cache_salt = absl::StrCat(config_.cache_salt, "/b");
  } else if (config_.compare()) {
    ro.compare_cache_salt = config_.cache_salt;
  }
  ro.num_threads = config_.client_threads;
  return ro;
}

void LoadRun::Stop() {
  absl::MutexLock lock(&mu_);
  stopped_ = true;
  if (current_runner_ != nullptr) {
    current_runner_->Stop();
  }
}

bool LoadRun::RunOnce(double request_rate, const std::string& sweep_label,
                      std::vector<TargetRun>* runs) {
  absl::StatusOr<std::unique_ptr<Workload>> workload = MakeWorkload();
  CHECK(workload.ok()) << workload.status();  // checked in Create
  std::optional<RunnerTarget> compare;
  if (config_.compare()) {
    compare = targets_[1];
  }
  absl::StatusOr<std::unique_ptr<LoadRunner>> runner =
      LoadRunner::Create(RunnerOptionsFor(request_rate), targets_[0], std::move(compare));
  CHECK(runner.ok()) << runner.status();  // checked in Create
  {
    absl::MutexLock lock(&mu_);
    current_runner_ = runner->get();
    if (stopped_) {
      (*runner)->Stop();  // Run then sends nothing: an empty, interrupted run
    }
  }
  RunInfo info = info_;
  info.request_rate = request_rate;
  info.started_at = absl::FormatTime(absl::RFC3339_sec, absl::Now(), absl::UTCTimeZone());
  absl::StatusOr<ProgressMode> mode = ParseProgressMode(config_.progress);
  RunResult result;
  {
    ProgressReporter progress(stderr, mode.value_or(ProgressMode::kOff),
                              [r = runner->get()] { return r->Progress(); });
    result = (*runner)->Run(workload->get());
  }
  {
    absl::MutexLock lock(&mu_);
    current_runner_ = nullptr;
  }
  Slo slo;
  if (config_.slo_ttft_ms > 0) {
    slo.ttft_ms = config_.slo_ttft_ms;
  }
  if (config_.slo_tpot_ms > 0) {
    slo.tpot_ms = config_.slo_tpot_ms;
  }
  info.interrupted = result.stopped;
  info.max_in_flight = result.max_in_flight;
  if (!config_.compare()) {
    TargetRun run;
    run.label = sweep_label;
    run.stem = sweep_label.empty() ? "run" : absl::StrCat("rate_", request_rate);
    run.summary = Summarize(result.records, result.duration_ns, slo);
    run.info = std::move(info);
    run.records = std::move(result.records);
    runs->push_back(std::move(run));
    return !result.stopped;
  }
  // Compare mode: split by target; each target's duration is its own first send -> last end.
  for (int target = 0; target < 2; ++target) {
    TargetRun run;
    run.label = target == 0 ? "A" : "B";
    run.stem = target == 0 ? "a" : "b";
    if (!sweep_label.empty()) {  // a compared sweep: "A rate=4", records_a_rate_4.csv
      run.label = absl::StrCat(run.label, " ", sweep_label);
      run.stem = absl::StrCat(run.stem, "_rate_", request_rate);
    }
    int64_t first = INT64_MAX;
    int64_t last = 0;
    for (RequestRecord& r : result.records) {
      if (r.target == target) {
        first = std::min(first, r.start_ns);
        last = std::max(last, r.end_ns);
        run.records.push_back(r);
      }
    }
    run.summary = Summarize(run.records, run.records.empty() ? 0 : last - first, slo);
    run.info = info;
    run.info.target = target == 0 ? config_.target : config_.compare_target;
    runs->push_back(std::move(run));
  }
  return !result.stopped;
}

LoadRunOutcome LoadRun::Run() {
  LoadRunOutcome out;
  if (sweep_rates_.empty()) {
    RunOnce(config_.request_rate, "", &out.runs);
  } else {
    for (double rate : sweep_rates_) {
      LOG(INFO) << "pd-loadtest: sweep: " << rate << " requests/s";
      if (!RunOnce(rate, absl::StrCat("rate=", rate), &out.runs)) {
        break;
      }
    }
  }
  out.summary = out.runs[0].summary;
  out.info = out.runs[0].info;
  for (const TargetRun& run : out.runs) {
    out.table += SummaryTable(run.summary, run.info);
  }
  if (config_.compare()) {
    // Runs come in pairs (A, B), one pair per rate of a sweep.
    std::vector<LabeledSummary> a_runs;
    std::vector<LabeledSummary> b_runs;
    for (size_t i = 0; i + 1 < out.runs.size(); i += 2) {
      if (!sweep_rates_.empty()) {
        absl::StrAppend(&out.table, "rate ", out.runs[i].info.request_rate, " req/s:\n");
      }
      out.table += CompareTable({"A", out.runs[i].summary, out.runs[i].info},
                                {"B", out.runs[i + 1].summary, out.runs[i + 1].info});
      a_runs.push_back({"A", out.runs[i].summary, out.runs[i].info});
      b_runs.push_back({"B", out.runs[i + 1].summary, out.runs[i + 1].info});
    }
    if (!sweep_rates_.empty()) {
      absl::StrAppend(&out.table, "A = ", config_.target, "\n", SweepTable(a_runs),
                      "B = ", config_.compare_target, "\n", SweepTable(b_runs));
    }
  } else if (!sweep_rates_.empty()) {
    std::vector<LabeledSummary> rates;
    for (const TargetRun& run : out.runs) {
      rates.push_back({run.label, run.summary, run.info});
    }
    out.table += SweepTable(rates);
  }
  WriteReports(&out);
  return out;
}

void LoadRun::WriteReports(LoadRunOutcome* out) const {
  std::vector<LabeledSummary> labeled;
  for (const TargetRun& run : out->runs) {
    labeled.push_back({run.label, run.summary, run.info});
  }
  std::string json;
  if (config_.compare() && !sweep_rates_.empty()) {
    std::vector<std::pair<LabeledSummary, LabeledSummary>> pairs;
    for (size_t i = 0; i + 1 < labeled.size(); i += 2) {
      pairs.emplace_back(labeled[i], labeled[i + 1]);
    }
    json = CompareSweepJson(pairs);
  } else if (config_.compare()) {
    json = CompareJson(labeled[0], labeled[1]);
  } else if (!sweep_rates_.empty()) {
    json = SweepJson(labeled);
  } else {
    json = SummaryJson(out->summary, out->info);
  }
  if (!config_.output_json.empty()) {
    out->report_status.Update(WriteFile(config_.output_json, json));
  }
  if (!config_.output_csv.empty()) {
    out->report_status.Update(WriteFile(config_.output_csv, RecordsCsv(out->runs[0].records)));
  }
  if (config_.output_dir.empty()) {
    return;
  }
  const std::string& dir = config_.output_dir;
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) {
    out->report_status.Update(absl::NotFoundError(
        absl::StrCat("cannot create --output_dir '", dir, "': ", ec.message())));
    return;
  }
  out->report_status.Update(WriteFile(absl::StrCat(dir, "/summary.json"), json));
  for (const TargetRun& run : out->runs) {
    out->report_status.Update(
        WriteFile(absl::StrCat(dir, "/", CsvName(run)), RecordsCsv(run.records)));
  }
  if (!config_.plot) {
    return;
  }
  std::vector<PlotRun> plot_runs;
  // Sweep series: one, or A's and B's in a compared sweep.
  std::vector<SweepSeries> sweep;
  if (!sweep_rates_.empty()) {
    if (config_.compare()) {
      sweep.push_back({absl::StrCat("A ", config_.target), "a", {}});
      sweep.push_back({absl::StrCat("B ", config_.compare_target), "b", {}});
    } else {
      sweep.push_back({"", "", {}});
    }
  }
  for (size_t i = 0; i < out->runs.size(); ++i) {
    const TargetRun& run = out->runs[i];
    std::string label = run.info.target;
    if (config_.compare() && !sweep_rates_.empty()) {
      label = absl::StrCat(i % 2 == 0 ? "A " : "B ", run.info.request_rate, " req/s");
    } else if (config_.compare()) {
      label = absl::StrCat(run.label, " ", run.info.target);
    } else if (!sweep_rates_.empty()) {
      label = absl::StrCat(run.info.request_rate, " req/s");
    }
    if (!sweep_rates_.empty()) {
      SweepPoint p;
      p.request_rate = run.info.request_rate;
      p.request_throughput = run.summary.request_throughput;
      p.output_throughput = run.summary.output_throughput;
      if (run.summary.slo.any()) {
        p.request_goodput = run.summary.request_goodput;
      }
      p.mean_ttft_ms = run.summary.ttft.mean;
      p.p99_ttft_ms = run.summary.ttft.p99;
      sweep[config_.compare() ? i % 2 : 0].points.push_back(p);
    }
    plot_runs.push_back({label, run.stem, &run.records});
  }
  absl::StatusOr<PlotFiles> plots = WritePlots(dir, plot_runs, sweep, config_.gnuplot);
  if (!plots.ok()) {
    out->report_status.Update(plots.status());
    return;
  }
  if (plots->images.empty()) {
    absl::StrAppend(&out->table, "Plots: scripts and data in ", dir, " (no images: ", plots->note,
                    ")\n");
  } else {
    absl::StrAppend(&out->table, "Plots: ", absl::StrJoin(plots->images, ", "), "\n");
  }
  out->plots = *std::move(plots);
}

}  // namespace pd::loadtest
