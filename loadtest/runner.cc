#include "loadtest/runner.h"

#include <grpcpp/client_context.h>
#include <grpcpp/support/async_stream.h>

#include <algorithm>
#include <chrono>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/log/log.h"
#include "services/base/grpc_status.h"

namespace pd::loadtest {

namespace v1 = ::pdserve::v1;

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

// One Generate stream driven through a completion queue: StartCall -> Read ... Read (not ok at
// the end of the stream) -> Finish. Owns its context, request and response. Exactly one
// operation is pending at a time, so its events are handled one after another (on the polling
// thread of its queue) and need no lock.
class LoadRunner::Call {
 public:
  enum class Op { kStart, kRead, kFinish };

  // The tag of an operation: the completion queue hands it back with the event.
  struct Tag {
    Call* call;
    Op op;
  };

  Call(LoadRunner* runner, RequestRecord record) : runner_(runner), record_(std::move(record)) {
    record_.itl_ns.reserve(static_cast<size_t>(std::max<int64_t>(record_.max_tokens - 1, 0)));
  }

  v1::GenerateRequest& request() { return request_; }
  grpc::ClientContext& context() { return context_; }
  // Set under the runner's mutex by Stop, read under it by Finished.
  bool cancelled_by_client = false;

  // Starts the stream on `cq`. Events follow on the queue's polling thread.
  void Start(v1::Generation::Stub* stub, grpc::CompletionQueue* cq) {
    reader_ = stub->PrepareAsyncGenerate(&context_, request_, cq);
    record_.start_ns = runner_->NowNs();
    reader_->StartCall(&start_tag_);
  }

  // Handles one event. Returns true when the stream is over and the call may be deleted.
  bool Proceed(Op op, bool ok) {
    switch (op) {
      case Op::kStart:
      case Op::kRead:
        if (!ok) {
          // Failed start or end of stream: the status comes with Finish.
          reader_->Finish(&status_, &finish_tag_);
          return false;
        }
        if (op == Op::kRead) {
          OnMessage();
        }
        reader_->Read(&response_, &read_tag_);
        return false;
      case Op::kFinish:
        OnDone();
        return true;
    }
    return false;
  }

 private:
  void OnMessage() {
    const int64_t now = runner_->NowNs();
    const int k = response_.token_ids_size();
    if (k > 0) {
      if (record_.first_token_ns < 0) {
        record_.first_token_ns = now;
      } else {
        const int64_t gap = (now - last_token_ns_) / k;
        record_.itl_ns.insert(record_.itl_ns.end(), static_cast<size_t>(k), gap);
      }
      last_token_ns_ = now;
      record_.output_tokens += k;
      runner_->output_tokens_.fetch_add(k, std::memory_order_relaxed);
    }
    if (response_.finish_reason() != v1::FINISH_REASON_UNSPECIFIED) {
      const std::string& name = v1::FinishReason_Name(response_.finish_reason());
      record_.finish_reason = std::string(absl::StripPrefix(name, "FINISH_REASON_"));
      if (response_.has_usage()) {
        record_.has_usage = true;
        record_.prompt_tokens = response_.usage().prompt_tokens();
        record_.cached_tokens = response_.usage().cached_tokens();
        record_.completion_tokens = response_.usage().completion_tokens();
      }
    }
  }

  void OnDone() {
    record_.end_ns = runner_->NowNs();
    if (!status_.ok()) {
      record_.code = services::FromGrpcStatus(status_).code();
      record_.error = status_.error_message();
    } else if (record_.finish_reason.empty()) {
      // The API promises a final message with a finish reason; its absence is a server bug.
      record_.code = absl::StatusCode::kInternal;
      record_.error = "stream ended OK without a finish reason";
    }
    runner_->Finished(this, std::move(record_));
  }

  LoadRunner* const runner_;
  RequestRecord record_;
  int64_t last_token_ns_ = 0;
  Tag start_tag_{this, Op::kStart};
  Tag read_tag_{this, Op::kRead};
  Tag finish_tag_{this, Op::kFinish};
  grpc::ClientContext context_;
  v1::GenerateRequest request_;
  v1::GenerateResponse response_;
  grpc::Status status_;
  std::unique_ptr<grpc::ClientAsyncReader<v1::GenerateResponse>> reader_;
};

LoadRunner::LoadRunner(RunnerOptions options, std::vector<std::shared_ptr<grpc::Channel>> channels,
                       std::vector<std::shared_ptr<grpc::Channel>> compare_channels)
    : options_(std::move(options)) {
  for (auto& channel : channels) {
    stubs_[0].push_back(v1::Generation::NewStub(channel));
    channels_.push_back(std::move(channel));
  }
  for (auto& channel : compare_channels) {
    stubs_[1].push_back(v1::Generation::NewStub(channel));
    channels_.push_back(std::move(channel));
  }
  for (int i = 0; i < options_.num_threads; ++i) {
    cqs_.push_back(std::make_unique<grpc::CompletionQueue>());
    pollers_.emplace_back([this, cq = cqs_.back().get()] { Poll(cq); });
  }
}

void LoadRunner::Poll(grpc::CompletionQueue* cq) {
  void* tag = nullptr;
  bool ok = false;
  while (cq->Next(&tag, &ok)) {
    Call::Tag* t = static_cast<Call::Tag*>(tag);
    if (t->call->Proceed(t->op, ok)) {
      delete t->call;
    }
  }
}

absl::StatusOr<std::unique_ptr<LoadRunner>> LoadRunner::Create(
    RunnerOptions options, std::vector<std::shared_ptr<grpc::Channel>> channels,
    std::vector<std::shared_ptr<grpc::Channel>> compare_channels) {
  if (absl::Status s = options.Validate(); !s.ok()) {
    return s;
  }
  if (channels.empty()) {
    return absl::InvalidArgumentError("LoadRunner needs at least one channel");
  }
  return std::unique_ptr<LoadRunner>(
      new LoadRunner(std::move(options), std::move(channels), std::move(compare_channels)));
}

LoadRunner::~LoadRunner() {
  {
    // Calls hold a pointer to the runner: never destroy it under them.
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(
        +[](absl::flat_hash_set<Call*>* s) { return s->empty(); }, &in_flight_));
  }
  for (auto& cq : cqs_) {
    cq->Shutdown();
  }
  for (std::thread& t : pollers_) {
    t.join();
  }
}

int64_t LoadRunner::NowNs() const {
  return SteadyNowNs() - start_steady_ns_.load(std::memory_order_acquire);
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
  auto call = std::make_unique<Call>(this, std::move(record));
  v1::GenerateRequest& req = call->request();
  req.set_model(options_.model);
  if (move_prompt) {
    req.mutable_token_ids()->mutable_ids()->Assign(spec.prompt.begin(), spec.prompt.end());
    spec.prompt.clear();
  } else {
    req.mutable_token_ids()->mutable_ids()->Assign(spec.prompt.begin(), spec.prompt.end());
  }
  req.mutable_sampling()->set_max_tokens(static_cast<uint32_t>(spec.output_len));
  req.mutable_sampling()->set_ignore_eos(options_.ignore_eos);
  req.set_client_request_id(absl::StrCat("pd-loadtest-", spec.index, target == 1 ? "-b" : ""));
  const std::string& salt = target == 1 ? options_.compare_cache_salt : options_.cache_salt;
  if (!salt.empty()) {
    req.set_cache_salt(salt);
  }
  if (options_.request_timeout > absl::ZeroDuration()) {
    call->context().set_deadline(std::chrono::system_clock::now() +
                                 absl::ToChronoNanoseconds(options_.request_timeout));
  }
  Call* raw = call.get();
  {
    absl::MutexLock lock(&mu_);
    if (stop_) {
      return false;
    }
    in_flight_.insert(raw);
    ++sent_;
    max_in_flight_ = std::max<int64_t>(max_in_flight_, static_cast<int64_t>(in_flight_.size()));
  }
  v1::Generation::Stub* stub = stubs_[target][next_stub_[target]].get();
  next_stub_[target] = (next_stub_[target] + 1) % stubs_[target].size();
  grpc::CompletionQueue* cq = cqs_[next_cq_].get();
  next_cq_ = (next_cq_ + 1) % cqs_.size();
  call.release()->Start(stub, cq);  // deleted by its polling thread after the Finish event
  return true;
}

void LoadRunner::Finished(Call* call, RequestRecord record) {
  absl::MutexLock lock(&mu_);
  in_flight_.erase(call);
  record.cancelled_by_client = call->cancelled_by_client && record.code != absl::StatusCode::kOk;
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
      +[](absl::flat_hash_set<Call*>* s) { return s->empty(); }, &in_flight_));
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
  for (Call* call : in_flight_) {
    call->cancelled_by_client = true;
    call->context().TryCancel();
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
