// RouterStream behind the real router pieces (GenerationService, WorkerPool, round_robin
// placement, the stories260K ModelFront), against two fake decode workers: real gRPC
// DecodeService servers on 127.0.0.1:0 in this process whose Generate plays scripts; and on
// its own behind a fake RouterStreamHost.
#include "services/router/router_stream.h"

#include <grpcpp/grpcpp.h>

#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "common/metrics/metrics.h"
#include "engine/runtime/model_front.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "pd/v1/generation.grpc.pb.h"
#include "pd/v1/worker.grpc.pb.h"
#include "services/base/grpc_status.h"
#include "services/router/generation_service.h"
#include "services/router/placement.h"
#include "services/router/router_config.h"
#include "services/router/worker_pool.h"

namespace pd::router {
namespace {

namespace iv1 = pdserve::internal::v1;
namespace v1 = pdserve::v1;

using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr absl::Duration kWait = absl::Seconds(10);  // bound of every wait; never reached

// What one DecodeService.Generate call does: send `messages`, then end with `status`, or, with
// `wait_for_cancel`, wait until the call is cancelled.
struct Script {
  std::vector<iv1::DecodeResponse> messages;
  grpc::Status status = grpc::Status::OK;
  bool wait_for_cancel = false;
  absl::Duration pause;  // between the last message and the status
};

iv1::DecodeResponse Tokens(std::vector<uint32_t> ids) {
  iv1::DecodeResponse r;
  for (uint32_t id : ids) {
    r.add_token_ids(id);
  }
  r.set_text(absl::StrCat("<", ids.size(), " tokens>"));
  return r;
}

iv1::DecodeResponse Final(std::vector<uint32_t> ids) {
  iv1::DecodeResponse r = Tokens(std::move(ids));
  r.set_finish_reason(v1::FINISH_REASON_LENGTH);
  r.mutable_usage()->set_prompt_tokens(20);
  r.mutable_usage()->set_cached_tokens(16);
  r.mutable_usage()->set_completion_tokens(4);
  r.mutable_timings()->set_queue_us(7);
  r.mutable_timings()->set_prefill_us(11);
  return r;
}

// The scripts of the Generate calls, in call order, whatever worker gets them; and what each
// call saw.
class Scripts {
 public:
  void Add(Script s) {
    absl::MutexLock lock(&mu_);
    scripts_.push_back(std::move(s));
  }
  std::optional<Script> Next(int worker, const iv1::DecodeRequest& request) {
    absl::MutexLock lock(&mu_);
    calls_.push_back(worker);
    requests_.push_back(request);
    if (scripts_.empty()) {
      return std::nullopt;
    }
    Script s = std::move(scripts_.front());
    scripts_.pop_front();
    return s;
  }
  std::vector<int> calls() const {
    absl::MutexLock lock(&mu_);
    return calls_;
  }
  std::vector<iv1::DecodeRequest> requests() const {
    absl::MutexLock lock(&mu_);
    return requests_;
  }
  absl::Notification& cancelled() { return cancelled_; }

 private:
  mutable absl::Mutex mu_;
  std::deque<Script> scripts_ ABSL_GUARDED_BY(mu_);
  std::vector<int> calls_ ABSL_GUARDED_BY(mu_);
  std::vector<iv1::DecodeRequest> requests_ ABSL_GUARDED_BY(mu_);
  absl::Notification cancelled_;  // a scripted call saw its cancellation
};

// Plays one Script.
class ScriptedCall final : public grpc::ServerWriteReactor<iv1::DecodeResponse> {
 public:
  ScriptedCall(Script script, Scripts* scripts) : script_(std::move(script)), scripts_(scripts) {
    absl::MutexLock lock(&mu_);
    NextLocked();
  }
  void OnWriteDone(bool ok) override {
    absl::MutexLock lock(&mu_);
    writing_ = false;
    if (!ok) {
      FinishLocked(grpc::Status(grpc::StatusCode::CANCELLED, "write failed"));
      return;
    }
    NextLocked();
  }
  void OnCancel() override {
    scripts_->cancelled().Notify();
    absl::MutexLock lock(&mu_);
    cancelled_ = true;
    if (!writing_) {
      FinishLocked(grpc::Status::CANCELLED);
    }
  }
  void OnDone() override { delete this; }

 private:
  void NextLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (cancelled_) {
      FinishLocked(grpc::Status::CANCELLED);
    } else if (next_ < script_.messages.size()) {
      writing_ = true;
      StartWrite(&script_.messages[next_++]);
    } else if (!script_.wait_for_cancel && script_.pause > absl::ZeroDuration()) {
      std::thread([this] {  // the call lives until Finish: `this` is valid until then
        absl::SleepFor(script_.pause);
        const grpc::Status status = script_.status;
        bool finish;
        {
          absl::MutexLock lock(&mu_);
          finish = !finished_;
          finished_ = true;
        }
        if (finish) Finish(status);  // OnDone may delete `this` from here on
      })
          .detach();
    } else if (!script_.wait_for_cancel) {
      FinishLocked(script_.status);
    }
  }
  void FinishLocked(const grpc::Status& status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!finished_) {
      finished_ = true;
      Finish(status);
    }
  }

  const Script script_;
  Scripts* const scripts_;
  absl::Mutex mu_;
  size_t next_ ABSL_GUARDED_BY(mu_) = 0;
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
};

// A decode worker: GetInfo and GetLoad as the router's pool expects, Generate from `scripts`.
class FakeDecodeWorker final : public iv1::DecodeService::CallbackService {
 public:
  FakeDecodeWorker(int index, std::string fingerprint, Scripts* scripts)
      : index_(index), fingerprint_(std::move(fingerprint)), scripts_(scripts) {}

  // Listens on 127.0.0.1:0; false when the server cannot start.
  bool Start() {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    builder.RegisterService(this);
    server_ = builder.BuildAndStart();
    return server_ != nullptr && port_ != 0;
  }
  void Shutdown() {
    if (server_ != nullptr) {
      server_->Shutdown(absl::ToChronoTime(absl::Now() + absl::Seconds(1)));
      server_.reset();
    }
  }
  std::string address() const { return absl::StrCat("127.0.0.1:", port_); }

  grpc::ServerWriteReactor<iv1::DecodeResponse>* Generate(
      grpc::CallbackServerContext* /*context*/, const iv1::DecodeRequest* request) override {
    std::optional<Script> script = scripts_->Next(index_, *request);
    if (!script.has_value()) {
      script.emplace();
      script->status = grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, "no script left");
    }
    return new ScriptedCall(*std::move(script), scripts_);
  }
  grpc::ServerUnaryReactor* GetInfo(grpc::CallbackServerContext* context,
                                    const iv1::GetInfoRequest* /*request*/,
                                    iv1::WorkerInfo* info) override {
    info->set_worker_id(WorkerId());
    info->set_role(iv1::WORKER_ROLE_DECODE);
    info->set_grpc_address(address());
    info->set_model_fingerprint(fingerprint_);
    info->mutable_layout()->set_block_size(16);
    info->mutable_layout()->set_dtype(iv1::KV_DTYPE_FP32);
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }
  grpc::ServerUnaryReactor* GetLoad(grpc::CallbackServerContext* context,
                                    const iv1::GetLoadRequest* /*request*/,
                                    iv1::WorkerLoad* load) override {
    load->set_worker_id(WorkerId());
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }

 private:
  std::string WorkerId() const { return absl::StrCat("fake-decode-", index_); }

  const int index_;
  const std::string fingerprint_;
  Scripts* const scripts_;
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
};

// A StreamSink that records what reaches the client, acknowledging each Send at once (inline,
// as a front end with a buffer may).
class RecordingSink final : public StreamSink {
 public:
  void Send(const v1::GenerateResponse& response) override {
    {
      absl::MutexLock lock(&mu_);
      messages_.push_back(response);
    }
    stream_->OnSent(true);
  }
  void End(const absl::Status& status) override {
    absl::MutexLock lock(&mu_);
    status_ = status;
    ended_.Notify();
  }

  RouterStream* stream_ = nullptr;
  absl::Notification ended_;
  absl::Mutex mu_;
  std::vector<v1::GenerateResponse> messages_ ABSL_GUARDED_BY(mu_);
  absl::Status status_ ABSL_GUARDED_BY(mu_);
};

class RouterStreamTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<engine::ModelFront>> model =
        engine::ModelFront::Load(PD_SHARED_DIR "/models/stories260K/stories260K.bin",
                                 PD_SHARED_DIR "/models/stories260K/tok512.bin");
    ASSERT_TRUE(model.ok()) << model.status();
    model_ = *std::move(model);
    for (int i = 0; i < 2; ++i) {
      workers_.push_back(std::make_unique<FakeDecodeWorker>(i, model_->fingerprint(), &scripts_));
      ASSERT_TRUE(workers_.back()->Start());
    }
    RouterConfig config;
    config.model = "stories260K.bin";
    config.decode_workers = {workers_[0]->address(), workers_[1]->address()};
    config.policy = "round_robin";
    WorkerPoolOptions options;
    options.health_interval = absl::Milliseconds(100);
    options.model_fingerprint = model_->fingerprint();
    options.block_size = 16;
    absl::StatusOr<std::unique_ptr<WorkerPool>> pool =
        WorkerPool::Create(config.decode_workers, {}, options, [this](const WorkerSnapshot& w) {
          absl::MutexLock lock(&health_mu_);
          healthy_[w.index] = w.healthy;
        });
    ASSERT_TRUE(pool.ok()) << pool.status();
    pool_ = *std::move(pool);
    absl::StatusOr<std::unique_ptr<PlacementPolicy>> policy = MakePlacementPolicy(config, nullptr);
    ASSERT_TRUE(policy.ok()) << policy.status();
    policy_ = *std::move(policy);
    absl::StatusOr<std::unique_ptr<GenerationService>> service =
        GenerationService::Create(config, model_.get(), pool_.get(), policy_.get(), &registry_);
    ASSERT_TRUE(service.ok()) << service.status();
    service_ = *std::move(service);
    ASSERT_TRUE(WaitForHealthyWorkers());

    int port = 0;
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(service_.get());
    router_ = builder.BuildAndStart();
    ASSERT_TRUE(router_ != nullptr && port != 0);
    stub_ = v1::Generation::NewStub(
        grpc::CreateChannel(absl::StrCat("127.0.0.1:", port), grpc::InsecureChannelCredentials()));
  }

  void TearDown() override {
    if (router_ != nullptr) {
      router_->Shutdown(absl::ToChronoTime(absl::Now() + absl::Seconds(1)));
    }
    pool_.reset();  // stops the health checks before the workers go
    for (auto& w : workers_) {
      w->Shutdown();
    }
  }

  // Both fake workers are in the pool (a retried one is back after a health check).
  bool WaitForHealthyWorkers() {
    absl::MutexLock lock(&health_mu_);
    auto both = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(health_mu_) {
      return healthy_[0] && healthy_[1];
    };
    return health_mu_.AwaitWithTimeout(absl::Condition(&both), kWait);
  }

  static v1::GenerateRequest Request() {
    v1::GenerateRequest r;
    for (uint32_t i = 1; i <= 20; ++i) {
      r.mutable_token_ids()->add_ids(i);
    }
    r.mutable_sampling()->set_max_tokens(4);
    r.mutable_sampling()->set_seed(42);
    return r;
  }

  struct Outcome {
    std::vector<v1::GenerateResponse> messages;
    grpc::Status status;
  };
  // One Generate through the router's gRPC API, read to the end.
  Outcome Generate() {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + kWait));
    std::unique_ptr<grpc::ClientReader<v1::GenerateResponse>> reader =
        stub_->Generate(&ctx, Request());
    Outcome out;
    v1::GenerateResponse r;
    while (reader->Read(&r)) {
      out.messages.push_back(r);
    }
    out.status = reader->Finish();
    return out;
  }

  static std::vector<uint32_t> AllTokens(const std::vector<v1::GenerateResponse>& messages) {
    std::vector<uint32_t> ids;
    for (const v1::GenerateResponse& m : messages) {
      ids.insert(ids.end(), m.token_ids().begin(), m.token_ids().end());
    }
    return ids;
  }

  // The value of the sample line "name{labels} value" of the Prometheus text; 0 when absent.
  double Counter(const std::string& sample) const {
    for (absl::string_view line : absl::StrSplit(registry_.RenderPrometheus(), '\n')) {
      double value = 0;
      if (absl::ConsumePrefix(&line, sample + " ") && absl::SimpleAtod(line, &value)) {
        return value;
      }
    }
    return 0;
  }

  Scripts scripts_;
  std::unique_ptr<engine::ModelFront> model_;
  std::vector<std::unique_ptr<FakeDecodeWorker>> workers_;
  metrics::Registry registry_;
  absl::Mutex health_mu_;
  bool healthy_[2] ABSL_GUARDED_BY(health_mu_) = {false, false};
  std::unique_ptr<WorkerPool> pool_;
  std::unique_ptr<PlacementPolicy> policy_;
  std::unique_ptr<GenerationService> service_;
  std::unique_ptr<grpc::Server> router_;
  std::unique_ptr<v1::Generation::Stub> stub_;
};

TEST_F(RouterStreamTest, RelaysEveryMessageAndTheFinalUsageAndTimings) {
  scripts_.Add({{Tokens({5}), Tokens({6, 7}), Final({8})}});
  const Outcome out = Generate();
  ASSERT_TRUE(out.status.ok()) << out.status.error_message();
  ASSERT_EQ(out.messages.size(), 3u);
  EXPECT_THAT(AllTokens(out.messages), ElementsAre(5, 6, 7, 8));
  EXPECT_EQ(out.messages[1].text(), "<2 tokens>");
  const std::vector<iv1::DecodeRequest> requests = scripts_.requests();
  ASSERT_EQ(requests.size(), 1u);
  EXPECT_FALSE(requests[0].request_id().empty());
  EXPECT_EQ(requests[0].token_ids_size(), 20);
  EXPECT_EQ(requests[0].block_hashes().size(), 16u * 1);  // one full block of 16 tokens
  EXPECT_EQ(out.messages[0].request_id(), requests[0].request_id());
  const v1::GenerateResponse& last = out.messages.back();
  EXPECT_EQ(last.request_id(), requests[0].request_id());
  EXPECT_EQ(last.finish_reason(), v1::FINISH_REASON_LENGTH);
  EXPECT_EQ(last.usage().prompt_tokens(), 20u);
  EXPECT_EQ(last.usage().cached_tokens(), 16u);
  EXPECT_EQ(last.usage().completion_tokens(), 4u);
  EXPECT_EQ(last.timings().queue_us(), 7u);
  EXPECT_EQ(last.timings().prefill_us(), 11u);
  EXPECT_GT(last.timings().total_us(), 0u);  // the router's own time
  EXPECT_LE(last.timings().first_token_us(), last.timings().total_us());
  EXPECT_FALSE(out.messages[1].has_usage());
  EXPECT_EQ(Counter("pd_router_requests_total{method=\"Generate\",code=\"OK\"}"), 1);
  EXPECT_EQ(Counter("pd_router_tokens_total{kind=\"generated\"}"), 4);
  EXPECT_EQ(service_->inflight(), 0);
}

TEST_F(RouterStreamTest, WorkerUnavailableBeforeTheFirstTokenIsRetriedOnTheOtherWorker) {
  scripts_.Add({{}, grpc::Status(grpc::StatusCode::UNAVAILABLE, "worker died")});
  scripts_.Add({{Tokens({5}), Tokens({6, 7}), Final({8})}});
  const Outcome out = Generate();
  ASSERT_TRUE(out.status.ok()) << out.status.error_message();
  EXPECT_THAT(AllTokens(out.messages), ElementsAre(5, 6, 7, 8));
  EXPECT_EQ(out.messages.back().finish_reason(), v1::FINISH_REASON_LENGTH);
  const std::vector<int> calls = scripts_.calls();
  ASSERT_EQ(calls.size(), 2u);
  EXPECT_NE(calls[0], calls[1]);
  const std::vector<iv1::DecodeRequest> requests = scripts_.requests();
  // The same request both times: same id, seed and block hashes.
  EXPECT_EQ(requests[0].request_id(), requests[1].request_id());
  EXPECT_EQ(requests[0].sampling().seed(), requests[1].sampling().seed());
  EXPECT_EQ(requests[0].block_hashes(), requests[1].block_hashes());
  EXPECT_EQ(Counter("pd_router_retries_total"), 1);
  EXPECT_EQ(Counter("pd_router_requests_total{method=\"Generate\",code=\"OK\"}"), 1);
}

iv1::DecodeResponse WithOffset(iv1::DecodeResponse r, uint64_t text_offset) {
  r.set_text_offset(text_offset);
  return r;
}

// Migration: the worker fails after 13 tokens reached the client; the other worker gets the
// same request with those tokens and the last text offset as its resume state, block hashes
// over prompt + streamed tokens, and no prefill worker; the client sees one stream.
TEST_F(RouterStreamTest, WorkerUnavailableMidStreamMovesTheStreamToTheOtherWorker) {
  scripts_.Add({{WithOffset(Tokens({5}), 3),
                 WithOffset(Tokens({6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17}), 40)},
                grpc::Status(grpc::StatusCode::UNAVAILABLE, "worker died")});
  scripts_.Add({{Tokens({18}), Final({19})}});
  const Outcome out = Generate();
  ASSERT_TRUE(out.status.ok()) << out.status.error_message();
  EXPECT_THAT(AllTokens(out.messages),
              ElementsAre(5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19));
  EXPECT_EQ(out.messages.back().finish_reason(), v1::FINISH_REASON_LENGTH);
  EXPECT_GT(out.messages.back().timings().first_token_us(), 0u);  // the first worker's token
  const std::vector<int> calls = scripts_.calls();
  ASSERT_EQ(calls.size(), 2u);
  EXPECT_NE(calls[0], calls[1]);
  const std::vector<iv1::DecodeRequest> requests = scripts_.requests();
  EXPECT_FALSE(requests[0].has_resume());
  EXPECT_EQ(requests[1].request_id(), requests[0].request_id());
  EXPECT_EQ(requests[1].sampling().seed(), requests[0].sampling().seed());
  EXPECT_EQ(requests[1].token_ids_size(), 20);  // the prompt stays the prompt
  EXPECT_THAT(requests[1].resume().token_ids(),
              ElementsAre(5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17));
  EXPECT_EQ(requests[1].resume().text_offset(), 40u);
  EXPECT_EQ(requests[1].block_hashes().size(), 16u * 2);  // 33 tokens: two full blocks
  EXPECT_EQ(requests[1].block_hashes().substr(0, 16), requests[0].block_hashes());
  EXPECT_TRUE(requests[1].prefill_address().empty());
  EXPECT_EQ(Counter("pd_router_migrations_total{reason=\"failure\",result=\"moved\"}"), 1);
  EXPECT_EQ(Counter("pd_router_migration_stall_seconds_count"), 1);
  EXPECT_EQ(Counter("pd_router_retries_total"), 0);
  EXPECT_EQ(Counter("pd_router_requests_total{method=\"Generate\",code=\"OK\"}"), 1);
  EXPECT_EQ(service_->inflight(), 0);
}

// A drain (the worker's UNAVAILABLE names it) moves the stream too, counted as a drain; the
// stream can move again when its second worker goes as well (after the first is back).
TEST_F(RouterStreamTest, DrainingWorkersHandStreamsOnTwice) {
  scripts_.Add({{Tokens({5})},
                grpc::Status(grpc::StatusCode::UNAVAILABLE,
                             absl::StrCat(services::kWorkerDrainingMessage, " (SIGTERM)"))});
  // The second move needs a worker in the pool: the first is back after a health check (every
  // 100 ms here) by the time the second fails.
  scripts_.Add({{Tokens({6})},
                grpc::Status(grpc::StatusCode::UNAVAILABLE, "worker died"),
                false,
                absl::Seconds(1)});
  scripts_.Add({{Final({7})}});
  const Outcome out = Generate();
  ASSERT_TRUE(out.status.ok()) << out.status.error_message();
  EXPECT_THAT(AllTokens(out.messages), ElementsAre(5, 6, 7));
  const std::vector<iv1::DecodeRequest> requests = scripts_.requests();
  ASSERT_EQ(requests.size(), 3u);
  EXPECT_THAT(requests[2].resume().token_ids(), ElementsAre(5, 6));
  EXPECT_EQ(Counter("pd_router_migrations_total{reason=\"drain\",result=\"moved\"}"), 1);
  EXPECT_EQ(Counter("pd_router_migrations_total{reason=\"failure\",result=\"moved\"}"), 1);
}

// With no worker left to take it, the stream ends UNAVAILABLE saying why it did not move.
TEST_F(RouterStreamTest, NoWorkerLeftEndsTheStreamSayingSo) {
  scripts_.Add({{Tokens({5})}, grpc::Status(grpc::StatusCode::UNAVAILABLE, "worker died")});
  workers_[1]->Shutdown();  // the other worker is gone too
  pool_->MarkFailed(1, absl::UnavailableError("test: gone"));
  const Outcome out = Generate();
  EXPECT_EQ(out.status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_THAT(out.status.error_message(), HasSubstr("worker died"));
  EXPECT_THAT(out.status.error_message(), HasSubstr("no decode worker can take the stream"));
  EXPECT_THAT(out.status.error_message(), HasSubstr("(retry)"));
  EXPECT_THAT(AllTokens(out.messages), ElementsAre(5));
  EXPECT_EQ(Counter("pd_router_migrations_total{reason=\"failure\",result=\"no_worker\"}"), 1);
  EXPECT_EQ(Counter("pd_router_requests_total{method=\"Generate\",code=\"UNAVAILABLE\"}"), 1);
}

TEST_F(RouterStreamTest, ClientCancellingMidStreamCancelsTheWorkerCall) {
  Script script;
  script.messages = {Tokens({5})};
  script.wait_for_cancel = true;
  scripts_.Add(std::move(script));
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + kWait));
  std::unique_ptr<grpc::ClientReader<v1::GenerateResponse>> reader =
      stub_->Generate(&ctx, Request());
  v1::GenerateResponse r;
  ASSERT_TRUE(reader->Read(&r));
  EXPECT_THAT(r.token_ids(), ElementsAre(5));
  ctx.TryCancel();
  EXPECT_TRUE(scripts_.cancelled().WaitForNotificationWithTimeout(kWait));
  while (reader->Read(&r)) {
  }
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::CANCELLED);
}

// A worker that dies after its last message (the finish reason went out) and before the call's
// status: the client has the whole stream, which ends OK, and nothing moves.
TEST_F(RouterStreamTest, WorkerDyingAfterItsFinalMessageStillEndsTheStreamOk) {
  scripts_.Add({{Tokens({5}), Final({6})},
                grpc::Status(grpc::StatusCode::UNAVAILABLE, "recvmsg:Connection reset by peer")});
  const Outcome out = Generate();
  ASSERT_TRUE(out.status.ok()) << out.status.error_message();
  EXPECT_THAT(AllTokens(out.messages), ElementsAre(5, 6));
  EXPECT_EQ(out.messages.back().finish_reason(), v1::FINISH_REASON_LENGTH);
  EXPECT_EQ(scripts_.calls().size(), 1u);
  EXPECT_EQ(Counter("pd_router_migrations_total{reason=\"failure\",result=\"moved\"}"), 0);
  EXPECT_EQ(Counter("pd_router_requests_total{method=\"Generate\",code=\"OK\"}"), 1);
  EXPECT_EQ(service_->inflight(), 0);
}

TEST_F(RouterStreamTest, WorkerEndingWithoutAFinishReasonIsInternal) {
  scripts_.Add({{Tokens({5}), Tokens({6})}});
  const Outcome out = Generate();
  EXPECT_EQ(out.status.error_code(), grpc::StatusCode::INTERNAL);
  EXPECT_THAT(out.status.error_message(), HasSubstr("without a finish reason"));
  EXPECT_THAT(AllTokens(out.messages), ElementsAre(5, 6));
}

// A message the router cannot parse (invalid UTF-8 in a proto string) ends the stream at once
// instead of waiting for the worker's status behind the unread messages.
TEST_F(RouterStreamTest, WorkerMessageThatDoesNotParseIsInternal) {
  iv1::DecodeResponse bad = Tokens({5});
  bad.set_text("\xff\xfe");
  Script script;
  script.messages = {bad, Final({6})};
  script.wait_for_cancel = true;
  scripts_.Add(std::move(script));
  const Outcome out = Generate();
  EXPECT_EQ(out.status.error_code(), grpc::StatusCode::INTERNAL);
  EXPECT_THAT(out.status.error_message(), HasSubstr("cannot read"));
  EXPECT_TRUE(out.messages.empty());
  EXPECT_TRUE(scripts_.cancelled().WaitForNotificationWithTimeout(kWait));
}

// The entry point of a front end that does not speak gRPC: same placement and relay, the
// client side behind a StreamSink.
TEST_F(RouterStreamTest, NewStreamRelaysToASinkOfAnotherFront) {
  scripts_.Add({{}, grpc::Status(grpc::StatusCode::UNAVAILABLE, "worker died")});
  scripts_.Add({{Tokens({5}), Final({6, 7})}});
  RecordingSink sink;
  absl::StatusOr<std::unique_ptr<RouterStream>> stream =
      service_->NewStream(Request(), CallerAuth{}, absl::InfiniteFuture(), &sink);
  ASSERT_TRUE(stream.ok()) << stream.status();
  EXPECT_EQ(service_->inflight(), 1);
  sink.stream_ = stream->get();
  (*stream)->Start();
  ASSERT_TRUE(sink.ended_.WaitForNotificationWithTimeout(kWait));
  {
    absl::MutexLock lock(&sink.mu_);
    EXPECT_TRUE(sink.status_.ok()) << sink.status_;
    EXPECT_THAT(AllTokens(sink.messages_), ElementsAre(5, 6, 7));
  }
  EXPECT_EQ(service_->inflight(), 0);  // released before the end reached the sink
  stream->reset();
  EXPECT_EQ(scripts_.calls().size(), 2u);
}

TEST_F(RouterStreamTest, NewStreamRefusesABadRequestWithoutTouchingTheSink) {
  RecordingSink sink;
  v1::GenerateRequest request = Request();
  request.set_model("another-model");
  absl::StatusOr<std::unique_ptr<RouterStream>> stream =
      service_->NewStream(request, CallerAuth{}, absl::InfiniteFuture(), &sink);
  EXPECT_EQ(stream.status().code(), absl::StatusCode::kNotFound);
  EXPECT_FALSE(sink.ended_.HasBeenNotified());
  EXPECT_EQ(service_->inflight(), 0);
  EXPECT_EQ(Counter("pd_router_requests_total{method=\"Generate\",code=\"NOT_FOUND\"}"), 1);
}

// logit_bias ids are checked against the model's vocabulary before any worker is involved.
TEST_F(RouterStreamTest, NewStreamRefusesALogitBiasOutsideTheVocabulary) {
  RecordingSink sink;
  v1::GenerateRequest request = Request();
  (*request.mutable_sampling()->mutable_logit_bias())[5] = 1.0f;
  (*request.mutable_sampling()->mutable_logit_bias())[9999] = -100.0f;
  absl::StatusOr<std::unique_ptr<RouterStream>> stream =
      service_->NewStream(request, CallerAuth{}, absl::InfiniteFuture(), &sink);
  EXPECT_EQ(stream.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(stream.status().message().find("sampling.logit_bias[9999]"), absl::string_view::npos)
      << stream.status();
  EXPECT_FALSE(sink.ended_.HasBeenNotified());
}

// A stream dropped before Start gives its slot back and calls no worker.
TEST_F(RouterStreamTest, StreamDestroyedBeforeStartReleasesItsSlot) {
  RecordingSink sink;
  absl::StatusOr<std::unique_ptr<RouterStream>> stream =
      service_->NewStream(Request(), CallerAuth{}, absl::InfiniteFuture(), &sink);
  ASSERT_TRUE(stream.ok()) << stream.status();
  EXPECT_EQ(service_->inflight(), 1);
  stream->reset();
  EXPECT_EQ(service_->inflight(), 0);
  EXPECT_TRUE(scripts_.calls().empty());
}

// RouterStream on its own, behind a fake host (RouterStreamHost): the real pool and placement
// of the fixture above, metrics in a registry of the host's, and the releases recorded.
class FakeHost final : public RouterStreamHost {
 public:
  FakeHost(WorkerPool* pool, PlacementPolicy* policy) : pool_(pool), policy_(policy) {
    const std::vector<double> buckets = {0.001, 1};
    metrics_.requests = *registry_.AddCounter("pd_host_requests_total", "", {"method", "code"});
    metrics_.ttft = *registry_.AddHistogram("pd_host_ttft_seconds", "", {}, buckets);
    metrics_.tpot = *registry_.AddHistogram("pd_host_tpot_seconds", "", {}, buckets);
    metrics_.itl = *registry_.AddHistogram("pd_host_itl_seconds", "", {}, buckets);
    metrics_.e2e = *registry_.AddHistogram("pd_host_e2e_seconds", "", {}, buckets);
    metrics_.tokens = *registry_.AddCounter("pd_host_tokens_total", "", {"kind"});
    metrics_.retries = *registry_.AddCounter("pd_host_retries_total", "", {});
    metrics_.migrations =
        *registry_.AddCounter("pd_host_migrations_total", "", {"reason", "result"});
    metrics_.migration_stall =
        *registry_.AddHistogram("pd_host_migration_stall_seconds", "", {}, buckets);
  }

  WorkerPool* workers() override { return pool_; }
  PlacementPolicy* policy() override { return policy_; }
  const RouterStreamMetrics& stream_metrics() const override { return metrics_; }
  int max_migrations() const override { return 1; }
  // A chain of its own: one hash per full block of 16, the block's first token as its value.
  absl::StatusOr<std::vector<BlockHash>> BlockHashesOf(const std::string& /*cache_salt*/,
                                                       absl::Span<const uint32_t> tokens) override {
    std::vector<BlockHash> chain;
    for (size_t i = 0; i + 16 <= tokens.size(); i += 16) {
      chain.push_back(BlockHash{tokens[i], 0});
    }
    return chain;
  }
  void ReleaseStream(const std::string& tenant) override {
    absl::MutexLock lock(&mu_);
    released_.push_back(tenant);
  }

  std::vector<std::string> released() {
    absl::MutexLock lock(&mu_);
    return released_;
  }
  std::string Metrics() const { return registry_.RenderPrometheus(); }

 private:
  WorkerPool* const pool_;
  PlacementPolicy* const policy_;
  metrics::Registry registry_;
  RouterStreamMetrics metrics_;
  absl::Mutex mu_;
  std::vector<std::string> released_ ABSL_GUARDED_BY(mu_);
};

// A sink that notes how many slots its host had released when the end came.
class ReleaseCheckingSink final : public StreamSink {
 public:
  explicit ReleaseCheckingSink(FakeHost* host) : host_(host) {}
  void Send(const v1::GenerateResponse& response) override {
    {
      absl::MutexLock lock(&mu_);
      tokens_.insert(tokens_.end(), response.token_ids().begin(), response.token_ids().end());
    }
    stream_->OnSent(true);
  }
  void End(const absl::Status& status) override {
    absl::MutexLock lock(&mu_);
    status_ = status;
    released_at_end_ = host_->released().size();
    ended_.Notify();
  }

  FakeHost* const host_;
  RouterStream* stream_ = nullptr;
  absl::Notification ended_;
  absl::Mutex mu_;
  std::vector<uint32_t> tokens_ ABSL_GUARDED_BY(mu_);
  absl::Status status_ ABSL_GUARDED_BY(mu_);
  size_t released_at_end_ ABSL_GUARDED_BY(mu_) = 0;
};

class RouterStreamHostTest : public RouterStreamTest {
 protected:
  static iv1::DecodeRequest Decode() {
    iv1::DecodeRequest d;
    d.set_request_id("req-1");
    d.set_tenant("t1");
    for (uint32_t i = 1; i <= 20; ++i) {
      d.add_token_ids(i);
    }
    d.mutable_sampling()->set_seed(42);
    return d;
  }
  static Placement OnWorker(int decode_index) {
    Placement p;
    p.decode_index = decode_index;
    return p;
  }
  // Runs Decode() on `decode_index` behind `host` to its end; the status it ended with.
  static absl::Status RunToEnd(FakeHost* host, ReleaseCheckingSink* sink, int decode_index) {
    RouterStream stream(host, sink, Decode(), OnWorker(decode_index), absl::InfiniteFuture());
    sink->stream_ = &stream;
    stream.Start();
    EXPECT_TRUE(sink->ended_.WaitForNotificationWithTimeout(kWait));
    absl::MutexLock lock(&sink->mu_);
    return sink->status_;
  }
};

TEST_F(RouterStreamHostTest, RelaysAndReleasesItsSlotOnceBeforeTheEnd) {
  scripts_.Add({{Tokens({5}), Final({6, 7})}});
  FakeHost host(pool_.get(), policy_.get());
  ReleaseCheckingSink sink(&host);
  const absl::Status status = RunToEnd(&host, &sink, 1);
  EXPECT_TRUE(status.ok()) << status;
  {
    absl::MutexLock lock(&sink.mu_);
    EXPECT_THAT(sink.tokens_, ElementsAre(5, 6, 7));
    EXPECT_EQ(sink.released_at_end_, 1u);
  }
  EXPECT_THAT(scripts_.calls(), ElementsAre(1));
  EXPECT_EQ(scripts_.requests()[0].request_id(), "req-1");
  EXPECT_THAT(host.released(), ElementsAre("t1"));
  EXPECT_THAT(host.Metrics(),
              HasSubstr("pd_host_requests_total{method=\"Generate\",code=\"OK\"} 1"));
  EXPECT_THAT(host.Metrics(), HasSubstr("pd_host_tokens_total{kind=\"generated\"} 4"));
}

// The retry asks the host's policy for another worker and counts in the host's metrics.
TEST_F(RouterStreamHostTest, RetryIsPlacedByTheHostsPolicy) {
  scripts_.Add({{}, grpc::Status(grpc::StatusCode::UNAVAILABLE, "worker died")});
  scripts_.Add({{Final({8})}});
  FakeHost host(pool_.get(), policy_.get());
  ReleaseCheckingSink sink(&host);
  const absl::Status status = RunToEnd(&host, &sink, 0);
  EXPECT_TRUE(status.ok()) << status;
  EXPECT_THAT(scripts_.calls(), ElementsAre(0, 1));
  EXPECT_THAT(host.Metrics(), HasSubstr("pd_host_retries_total 1"));
  EXPECT_THAT(host.released(), ElementsAre("t1"));
}

// The host's budget (one move here) bounds the moves; past it the stream ends UNAVAILABLE
// naming the budget, with every token that was streamed delivered once.
TEST_F(RouterStreamHostTest, MovesStopAtTheHostsBudget) {
  scripts_.Add({{Tokens({5})}, grpc::Status(grpc::StatusCode::UNAVAILABLE, "worker died")});
  scripts_.Add({{Tokens({6})}, grpc::Status(grpc::StatusCode::UNAVAILABLE, "died again")});
  FakeHost host(pool_.get(), policy_.get());
  ReleaseCheckingSink sink(&host);
  const absl::Status status = RunToEnd(&host, &sink, 0);
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(status.message(), HasSubstr("died again"));
  EXPECT_THAT(status.message(), HasSubstr("--max_migrations"));
  {
    absl::MutexLock lock(&sink.mu_);
    EXPECT_THAT(sink.tokens_, ElementsAre(5, 6));
  }
  EXPECT_THAT(scripts_.calls(), ElementsAre(0, 1));
  EXPECT_THAT(scripts_.requests()[1].resume().token_ids(), ElementsAre(5));
  EXPECT_THAT(host.Metrics(),
              HasSubstr("pd_host_migrations_total{reason=\"failure\",result=\"moved\"} 1"));
  EXPECT_THAT(host.Metrics(), HasSubstr("pd_host_migrations_total{reason=\"failure\","
                                        "result=\"budget_spent\"} 1"));
  EXPECT_THAT(host.released(), ElementsAre("t1"));
}

TEST_F(RouterStreamHostTest, StreamDestroyedBeforeStartReleasesOnceAndCallsNoWorker) {
  FakeHost host(pool_.get(), policy_.get());
  ReleaseCheckingSink sink(&host);
  { RouterStream stream(&host, &sink, Decode(), OnWorker(0), absl::InfiniteFuture()); }
  EXPECT_THAT(host.released(), ElementsAre("t1"));
  EXPECT_TRUE(scripts_.calls().empty());
  EXPECT_FALSE(sink.ended_.HasBeenNotified());
}

}  // namespace
}  // namespace pd::router
