#include "loadtest/runner.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/log/log.h"
#include "loadtest/grpc_client.h"

namespace pd::loadtest {

namespace {

int64_t SteadyNowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

absl::Status RunnerOptions::Validate() const {
  if (concurrency < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--concurrency must be >= 0, got ", concurrency));
  }
  if (arrival == ArrivalMode::kClosed && concurrency < 1) {
    return absl::InvalidArgumentError("closed-loop arrival needs --concurrency >= 1");
  }
  if (arrival == ArrivalMode::kPoisson || arrival == ArrivalMode::kGamma) {
    if (!(request_rate > 0) || !std::isfinite(request_rate)) {
      return absl::InvalidArgumentError(absl::StrCat(
          ArrivalModeName(arrival), " arrival needs --request_rate > 0, got ", request_rate));
    }
    if (!(burstiness > 0) || !std::isfinite(burstiness)) {
      return absl::InvalidArgumentError(absl::StrCat("--burstiness must be > 0, got ", burstiness));
    }
  }
  if (num_requests < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--num_requests must be >= 0, got ", num_requests));
  }
  if (num_threads < 1 || num_threads > 64) {
    return absl::InvalidArgumentError(
        absl::StrCat("--client_threads must be in [1, 64], got ", num_threads));
  }
  if (duration < absl::ZeroDuration() || request_timeout < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("--duration and --request_timeout must be >= 0");
  }
  return absl::OkStatus();
}

LoadRunner::LoadRunner(RunnerOptions options) : options_(std::move(options)) {}

absl::StatusOr<std::unique_ptr<LoadRunner>> LoadRunner::Create(
    RunnerOptions options, std::vector<std::shared_ptr<grpc::Channel>> channels,
    std::vector<std::shared_ptr<grpc::Channel>> compare_channels) {
  RunnerTarget target;
  target.channels = std::move(channels);
  std::optional<RunnerTarget> compare;
  if (!compare_channels.empty()) {
    compare.emplace();
    compare->channels = std::move(compare_channels);
  }
  return Create(std::move(options), std::move(target), std::move(compare));
}

absl::StatusOr<std::unique_ptr<LoadRunner>> LoadRunner::Create(
    RunnerOptions options, RunnerTarget target, std::optional<RunnerTarget> compare) {
  if (absl::Status s = options.Validate(); !s.ok()) {
    return s;
  }
  RunnerTarget* targets[2] = {&target, compare.has_value() ? &*compare : nullptr};
  for (RunnerTarget* t : targets) {
    if (t != nullptr && t->backend == Backend::kGrpc && t->channels.empty()) {
      return absl::InvalidArgumentError("LoadRunner needs at least one channel");
    }
  }
  std::unique_ptr<LoadRunner> runner(new LoadRunner(std::move(options)));
  const RunnerOptions& o = runner->options_;
  // One gRPC client for every gRPC target, so that both share the polling threads.
  std::vector<std::shared_ptr<grpc::Channel>> grpc_channels[2];
  bool any_grpc = false;
  for (int i = 0; i < 2; ++i) {
    if (targets[i] != nullptr && targets[i]->backend == Backend::kGrpc) {
      grpc_channels[i] = std::move(targets[i]->channels);
      any_grpc = true;
    }
  }
  if (any_grpc) {
    GrpcClientOptions go;
    go.model = o.model;
    go.request_timeout = o.request_timeout;
    go.ignore_eos = o.ignore_eos;
    go.temperature = o.temperature;
    go.penalties = o.penalties;
    go.json_schema = o.json_schema;
    go.num_threads = o.num_threads;
    runner->owned_clients_.push_back(std::make_unique<GrpcClient>(
        runner.get(), go, std::move(grpc_channels[0]), std::move(grpc_channels[1])));
  }
  for (int i = 0; i < 2; ++i) {
    if (targets[i] == nullptr) {
      continue;
    }
    if (targets[i]->backend == Backend::kGrpc) {
      runner->clients_[i] = runner->owned_clients_.front().get();
      continue;
    }
    OpenAiClientOptions oo = targets[i]->openai;
    oo.request_timeout = o.request_timeout;
    oo.ignore_eos = o.ignore_eos;
    oo.temperature = o.temperature;
    oo.penalties = o.penalties;
    oo.json_schema = o.json_schema;
    absl::StatusOr<std::unique_ptr<OpenAiClient>> client =
        OpenAiClient::Create(runner.get(), std::move(oo));
    if (!client.ok()) {
      return client.status();
    }
    runner->clients_[i] = client->get();
    runner->send_salt_[i] = targets[i]->openai_cache_salt;
    runner->owned_clients_.push_back(*std::move(client));
  }
  return runner;
}

LoadRunner::~LoadRunner() {
  {
    // Calls hold a pointer to the runner: never destroy it under them.
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(
        +[](absl::flat_hash_set<InFlight*>* s) { return s->empty(); }, &in_flight_));
  }
  owned_clients_.clear();  // joins their threads
}

bool LoadRunner::SleepUntil(int64_t offset_ns) {
  const int64_t wait_ns = offset_ns - NowNs();
  absl::MutexLock lock(&mu_);
  if (wait_ns > 0) {
    mu_.AwaitWithTimeout(absl::Condition(&stop_), absl::Nanoseconds(wait_ns));
  }
  return !stop_;
}

bool LoadRunner::WaitForSlots(int64_t slots) {
  // In compare mode the limit is per target; a pair needs two free slots.
  const int64_t limit = options_.concurrency * num_targets() - (slots - 1);
  struct Args {
    LoadRunner* self;
    int64_t limit;
  } args{this, limit};
  // Runs with mu_ held (absl::Condition); the analysis cannot see through the pointer.
  auto ready = [](Args* a) ABSL_NO_THREAD_SAFETY_ANALYSIS {
    return a->self->stop_ || static_cast<int64_t>(a->self->in_flight_.size()) < a->limit;
  };
  absl::MutexLock lock(&mu_);
  if (options_.duration > absl::ZeroDuration()) {
    const int64_t left_ns = absl::ToInt64Nanoseconds(options_.duration) - NowNs();
    if (left_ns <= 0) {
      return false;
    }
    if (!mu_.AwaitWithTimeout(absl::Condition(+ready, &args), absl::Nanoseconds(left_ns))) {
      return false;  // the duration bound passed while every slot was busy
    }
  } else {
    mu_.Await(absl::Condition(+ready, &args));
  }
  return !stop_;
}

bool LoadRunner::Launch(RequestSpec& spec, int64_t scheduled_ns, int target, bool move_prompt) {
  RequestRecord record;
  record.index = spec.index;
  record.target = target;
  record.source_line = spec.source_line;
  record.scheduled_ns = scheduled_ns;
  record.input_tokens = static_cast<int64_t>(spec.prompt.size());
  record.max_tokens = spec.output_len;
  RequestParams params;
  params.client_request_id = absl::StrCat("pd-loadtest-", spec.index, target == 1 ? "-b" : "");
  if (send_salt_[target]) {
    params.cache_salt = target == 1 ? options_.compare_cache_salt : options_.cache_salt;
  }
  RequestClient* client = clients_[target];
  std::unique_ptr<InFlight> request = client->Prepare(spec, move_prompt, params, std::move(record));
  {
    absl::MutexLock lock(&mu_);
    if (stop_) {
      return false;
    }
    in_flight_.insert(request.get());
    ++sent_;
    max_in_flight_ = std::max<int64_t>(max_in_flight_, static_cast<int64_t>(in_flight_.size()));
  }
  client->Start(std::move(request));  // deleted by the client after Finished
  return true;
}

void LoadRunner::Finished(InFlight* request, RequestRecord record) {
  absl::MutexLock lock(&mu_);
  in_flight_.erase(request);
  record.cancelled_by_client = request->cancelled_by_client && record.code != absl::StatusCode::kOk;
  if (record.ok()) {
    ++completed_;
  } else {
    ++failed_;
    VLOG(1) << "request " << record.index << " failed: " << StatusCodeName(record.code) << ": "
            << record.error;
  }
  last_end_ns_ = std::max(last_end_ns_, record.end_ns);
  records_.push_back(std::move(record));
}

RunResult LoadRunner::Run(Workload* workload) {
  {
    absl::MutexLock lock(&mu_);
    CHECK(!running_) << "LoadRunner::Run called twice";
    running_ = true;
    std::optional<int64_t> total = workload->size();
    if (options_.num_requests > 0) {
      total = std::min(total.value_or(options_.num_requests), options_.num_requests);
    }
    if (total.has_value()) {
      *total *= num_targets();
    }
    total_requests_ = total;
  }
  start_steady_ns_.store(SteadyNowNs(), std::memory_order_release);  // pairs with NowNs
  const int64_t duration_ns =
      options_.duration > absl::ZeroDuration() ? absl::ToInt64Nanoseconds(options_.duration) : 0;
  std::optional<ArrivalGaps> gaps;
  if (options_.arrival == ArrivalMode::kPoisson || options_.arrival == ArrivalMode::kGamma) {
    const double shape = options_.arrival == ArrivalMode::kPoisson ? 1.0 : options_.burstiness;
    absl::StatusOr<ArrivalGaps> g =
        ArrivalGaps::Create(options_.request_rate, shape, options_.seed);
    CHECK(g.ok()) << g.status();  // validated in Create
    gaps.emplace(*std::move(g));
  }
  int64_t next_open_loop_ns = 0;
  int64_t issued = 0;
  RequestSpec spec;
  while (options_.num_requests == 0 || issued < options_.num_requests) {
    if (!workload->Next(&spec)) {
      break;
    }
    int64_t scheduled_ns = -1;  // closed loop: when a slot frees up
    if (gaps.has_value()) {
      scheduled_ns = next_open_loop_ns;
      next_open_loop_ns += absl::ToInt64Nanoseconds(gaps->Next());
    } else if (options_.arrival == ArrivalMode::kTrace) {
      scheduled_ns = absl::ToInt64Nanoseconds(spec.arrival_offset.value_or(absl::ZeroDuration()));
    }
    if (duration_ns > 0 && scheduled_ns >= duration_ns) {
      break;
    }
    if (scheduled_ns > 0 && !SleepUntil(scheduled_ns)) {
      break;
    }
    const int targets = num_targets();
    if (options_.concurrency > 0 && !WaitForSlots(targets)) {
      break;
    }
    const int64_t now = NowNs();
    if (duration_ns > 0 && now >= duration_ns) {
      break;
    }
    // Compare mode: both copies now, the first target alternating (A B, B A, ...).
    bool launched = true;
    for (int k = 0; k < targets && launched; ++k) {
      const int target = targets == 1 ? 0 : static_cast<int>((issued + k) % 2);
      launched = Launch(spec, scheduled_ns < 0 ? now : scheduled_ns, target, k == targets - 1);
    }
    if (!launched) {
      break;
    }
    ++issued;
  }
  RunResult result;
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(
      +[](absl::flat_hash_set<InFlight*>* s) { return s->empty(); }, &in_flight_));
  result.records = std::move(records_);
  records_.clear();
  std::sort(result.records.begin(), result.records.end(),
            [](const RequestRecord& a, const RequestRecord& b) {
              return a.index != b.index ? a.index < b.index : a.target < b.target;
            });
  int64_t first_start = INT64_MAX;
  for (const RequestRecord& r : result.records) {
    first_start = std::min(first_start, r.start_ns);
  }
  result.duration_ns = result.records.empty() ? 0 : last_end_ns_ - first_start;
  result.max_in_flight = max_in_flight_;
  result.stopped = stop_;
  return result;
}

void LoadRunner::Stop() {
  absl::MutexLock lock(&mu_);
  if (stop_) {
    return;
  }
  stop_ = true;
  for (InFlight* request : in_flight_) {
    request->cancelled_by_client = true;
    request->Cancel();
  }
}

ProgressSnapshot LoadRunner::Progress() const {
  ProgressSnapshot s;
  s.elapsed_s = start_steady_ns_.load(std::memory_order_acquire) == 0
                    ? 0
                    : static_cast<double>(NowNs()) / 1e9;
  s.output_tokens = output_tokens_.load(std::memory_order_relaxed);
  if (options_.duration > absl::ZeroDuration()) {
    s.duration_s = absl::ToDoubleSeconds(options_.duration);
  }
  absl::MutexLock lock(&mu_);
  s.sent = sent_;
  s.completed = completed_;
  s.failed = failed_;
  s.in_flight = static_cast<int64_t>(in_flight_.size());
  s.total_requests = total_requests_;
  return s;
}

}  // namespace pd::loadtest
