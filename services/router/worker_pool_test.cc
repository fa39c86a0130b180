// WorkerPool's health checks against a fake decode worker served in-process on 127.0.0.1: a
// worker too busy to answer GetLoad in time stays in the pool for max_missed_checks - 1 misses,
// one that keeps timing out leaves it, one whose streams deliver stays, and one whose server is
// gone leaves at once.
//
// The checks run on the test's thread (CreateForTest + CheckNowForTest) and the activity window
// is read from a FakeClock, so the outcome depends on the number of checks, never on how fast
// a loaded machine runs them. A timed-out GetLoad is the fake answering DEADLINE_EXCEEDED (what
// the pool sees when its deadline passes); one test lets a real 50 ms deadline pass instead, and
// one runs the pool's own checker threads.
#include "services/router/worker_pool.h"

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/time/clock.h"
#include "gtest/gtest.h"
#include "pd/v1/worker.grpc.pb.h"

namespace pd::router {
namespace {

namespace iv1 = pdserve::internal::v1;

constexpr char kFingerprint[] = "f00d";

// How the fake answers GetLoad.
enum class LoadMode {
  kAnswer,    // at once
  kTimedOut,  // DEADLINE_EXCEEDED at once: the status of a call whose deadline passed
  kHang,      // not until Release(): the caller's own deadline ends the call
};

// Answers GetInfo at once and GetLoad per its mode (the sync API: one handler thread each, so a
// hung GetLoad does not hold up the others).
class FakeWorker final : public iv1::DecodeService::Service {
 public:
  bool Start() {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    builder.RegisterService(this);
    server_ = builder.BuildAndStart();
    return server_ != nullptr && port_ != 0;
  }
  void Shutdown() {
    Release();
    if (server_ == nullptr) return;
    server_->Shutdown(absl::ToChronoTime(absl::Now()));
    server_.reset();
  }
  std::string address() const { return absl::StrCat("127.0.0.1:", port_); }
  void set_load_mode(LoadMode mode) { mode_ = mode; }
  int load_calls() const { return load_calls_; }
  // Lets hung GetLoad calls return.
  void Release() {
    if (!release_.HasBeenNotified()) release_.Notify();
  }

  grpc::Status GetInfo(grpc::ServerContext*, const iv1::GetInfoRequest*,
                       iv1::WorkerInfo* info) override {
    info->set_worker_id("w0");
    info->set_role(iv1::WORKER_ROLE_DECODE);
    info->set_model_fingerprint(kFingerprint);
    info->mutable_layout()->set_block_size(16);
    info->mutable_layout()->set_dtype(iv1::KV_DTYPE_FP32);
    return grpc::Status::OK;
  }
  grpc::Status GetLoad(grpc::ServerContext*, const iv1::GetLoadRequest*,
                       iv1::WorkerLoad* load) override {
    ++load_calls_;
    switch (mode_.load()) {
      case LoadMode::kAnswer:
        break;
      case LoadMode::kTimedOut:
        return grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "deadline exceeded (fake)");
      case LoadMode::kHang:
        release_.WaitForNotificationWithTimeout(absl::Seconds(30));
        break;
    }
    load->set_worker_id("w0");
    return grpc::Status::OK;
  }

 private:
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  std::atomic<LoadMode> mode_{LoadMode::kAnswer};
  std::atomic<int> load_calls_{0};
  absl::Notification release_;
};

class WorkerPoolTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(worker_.Start()); }
  void TearDown() override {
    pool_.reset();
    worker_.Shutdown();
  }

  WorkerPoolOptions Options(int max_missed_checks) {
    WorkerPoolOptions options;
    options.health_interval = absl::Milliseconds(500);
    options.rpc_timeout = absl::Seconds(10);  // only the fake's answers time a check out
    options.max_missed_checks = max_missed_checks;
    options.model_fingerprint = kFingerprint;
    return options;
  }
  WorkerPool::HealthCallback Record() {
    return [this](const WorkerSnapshot& w) {
      absl::MutexLock lock(&mu_);
      changes_.push_back(w.healthy);
    };
  }
  // A pool whose checks run only when the test calls Check(); the first one admits the worker.
  void StartPool(WorkerPoolOptions options) {
    absl::StatusOr<std::unique_ptr<WorkerPool>> pool =
        WorkerPool::CreateForTest({worker_.address()}, {}, options, Record(), &clock_);
    ASSERT_TRUE(pool.ok()) << pool.status();
    pool_ = *std::move(pool);
    Check();
    ASSERT_TRUE(Healthy()) << pool_->Snapshot()[0].last_error;
    ASSERT_EQ(Changes(), std::vector<bool>{true});
  }
  void StartPool(int max_missed_checks) { StartPool(Options(max_missed_checks)); }
  void Check() { pool_->CheckNowForTest(0); }
  bool Healthy() { return pool_->Snapshot()[0].healthy; }

  // The health changes reported so far (true = joined, false = left).
  std::vector<bool> Changes() {
    absl::MutexLock lock(&mu_);
    return changes_;
  }

  FakeWorker worker_;
  FakeClock clock_;
  std::unique_ptr<WorkerPool> pool_;
  absl::Mutex mu_;
  std::vector<bool> changes_ ABSL_GUARDED_BY(mu_);
};

TEST_F(WorkerPoolTest, ABusyWorkerStaysForFewerThanMaxMissedChecks) {
  StartPool(/*max_missed_checks=*/3);
  worker_.set_load_mode(LoadMode::kTimedOut);
  Check();
  Check();  // two misses of three
  EXPECT_TRUE(Healthy());
  EXPECT_NE(pool_->Snapshot()[0].last_error.find("GetLoad"), std::string::npos);
  worker_.set_load_mode(LoadMode::kAnswer);
  Check();  // answered in time again: the count starts over
  worker_.set_load_mode(LoadMode::kTimedOut);
  Check();
  Check();
  EXPECT_TRUE(Healthy());
  worker_.set_load_mode(LoadMode::kAnswer);
  Check();
  EXPECT_EQ(Changes(), std::vector<bool>{true});  // joined once, never left
  EXPECT_TRUE(Healthy());
  EXPECT_EQ(worker_.load_calls(), 7);
}

TEST_F(WorkerPoolTest, AWorkerThatKeepsTimingOutLeaves) {
  StartPool(/*max_missed_checks=*/3);
  worker_.set_load_mode(LoadMode::kTimedOut);
  Check();
  Check();
  EXPECT_EQ(Changes(), std::vector<bool>{true});
  Check();  // the third miss in a row
  EXPECT_EQ(Changes(), (std::vector<bool>{true, false}));
  EXPECT_FALSE(Healthy());
  EXPECT_NE(pool_->Snapshot()[0].last_error.find("GetLoad"), std::string::npos)
      << pool_->Snapshot()[0].last_error;
  EXPECT_FALSE(pool_->WaitForDecodeWorker(absl::ZeroDuration()));
  // It answers again: re-verified and back in.
  worker_.set_load_mode(LoadMode::kAnswer);
  Check();
  EXPECT_EQ(Changes(), (std::vector<bool>{true, false, true}));
  EXPECT_TRUE(pool_->WaitForDecodeWorker(absl::ZeroDuration()));
}

TEST_F(WorkerPoolTest, OneMissedCheckIsEnoughWhenAskedFor) {
  StartPool(/*max_missed_checks=*/1);
  worker_.set_load_mode(LoadMode::kTimedOut);
  Check();
  EXPECT_EQ(Changes(), (std::vector<bool>{true, false}));
}

TEST_F(WorkerPoolTest, AWorkerWhoseStreamsDeliverStaysWhileItsChecksTimeOut) {
  WorkerPoolOptions options = Options(/*max_missed_checks=*/1);  // one timeout takes it out
  const absl::Duration window = options.health_interval + options.rpc_timeout;
  StartPool(options);
  worker_.set_load_mode(LoadMode::kTimedOut);
  for (int i = 0; i < 4; ++i) {  // its streams keep delivering messages
    pool_->NoteActivity(0);
    clock_.Advance(window - absl::Milliseconds(1));
    Check();
    ASSERT_TRUE(Healthy()) << "check " << i << ": " << pool_->Snapshot()[0].last_error;
  }
  EXPECT_EQ(Changes(), std::vector<bool>{true});  // four checks timed out; never left
  EXPECT_EQ(worker_.load_calls(), 5);
  // The streams stop: once the last message is a whole window old, the next timeout counts.
  clock_.Advance(absl::Milliseconds(1));
  Check();
  EXPECT_EQ(Changes(), (std::vector<bool>{true, false}));
}

// No fake answer: the pool's own RPC deadline (real time) ends the call.
TEST_F(WorkerPoolTest, AHungGetLoadTimesOutOnTheRpcDeadline) {
  WorkerPoolOptions options = Options(/*max_missed_checks=*/1);
  options.rpc_timeout = absl::Milliseconds(50);
  StartPool(options);
  worker_.set_load_mode(LoadMode::kHang);
  Check();
  worker_.Release();
  EXPECT_EQ(Changes(), (std::vector<bool>{true, false}));
  const std::string error = pool_->Snapshot()[0].last_error;
  EXPECT_NE(error.find("GetLoad"), std::string::npos) << error;
}

TEST_F(WorkerPoolTest, AGoneWorkerLeavesAtOnce) {
  StartPool(/*max_missed_checks=*/100);  // timeouts tolerated; a refused connection is not
  worker_.Shutdown();
  Check();
  EXPECT_EQ(Changes(), (std::vector<bool>{true, false}));
}

TEST_F(WorkerPoolTest, AWorkerWithAnotherKvDtypeStaysOut) {
  WorkerPoolOptions options = Options(/*max_missed_checks=*/3);
  options.kv_dtype = iv1::KV_DTYPE_BF16;  // the worker's cache is f32
  absl::StatusOr<std::unique_ptr<WorkerPool>> pool =
      WorkerPool::CreateForTest({worker_.address()}, {}, options, Record(), &clock_);
  ASSERT_TRUE(pool.ok()) << pool.status();
  (*pool)->CheckNowForTest(0);
  EXPECT_FALSE((*pool)->Snapshot()[0].healthy);
  EXPECT_TRUE(Changes().empty());
  const std::string error = (*pool)->Snapshot()[0].last_error;
  EXPECT_NE(error.find("KV dtype KV_DTYPE_FP32 != router's KV_DTYPE_BF16"), std::string::npos)
      << error;
  EXPECT_EQ(worker_.load_calls(), 0);  // never admitted, never asked for its load
}

// Create's checker threads: the first check admits the worker, a later one sees it gone.
TEST_F(WorkerPoolTest, TheCheckerThreadsAdmitAndDropAWorker) {
  WorkerPoolOptions options = Options(/*max_missed_checks=*/3);
  options.health_interval = absl::Milliseconds(10);
  absl::StatusOr<std::unique_ptr<WorkerPool>> pool =
      WorkerPool::Create({worker_.address()}, {}, options, Record());
  ASSERT_TRUE(pool.ok()) << pool.status();
  pool_ = *std::move(pool);
  ASSERT_TRUE(pool_->WaitForDecodeWorker(absl::Seconds(10)));
  worker_.Shutdown();
  absl::MutexLock lock(&mu_);
  auto left = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return !changes_.empty() && !changes_.back();
  };
  EXPECT_TRUE(mu_.AwaitWithTimeout(absl::Condition(&left), absl::Seconds(10)))
      << "the worker did not leave the pool within 10 s of its server going away";
}

TEST_F(WorkerPoolTest, RejectsZeroMissedChecks) {
  WorkerPoolOptions options;
  options.max_missed_checks = 0;
  EXPECT_EQ(WorkerPool::Create({worker_.address()}, {}, options).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace pd::router
