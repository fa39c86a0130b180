// WorkerPool's health checks against a fake decode worker served in-process on 127.0.0.1: a
// worker too busy to answer GetLoad in time stays in the pool for max_missed_checks - 1 misses,
// one that keeps timing out leaves it, and one whose server is gone leaves at once.
#include "services/router/worker_pool.h"

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "pd/v1/worker.grpc.pb.h"

namespace pd::router {
namespace {

namespace iv1 = pdserve::internal::v1;

constexpr char kFingerprint[] = "f00d";
constexpr absl::Duration kTimeout = absl::Milliseconds(250);  // slack for a loaded CI machine

// Answers GetInfo at once and GetLoad after `load_delay` (the sync API: one handler thread
// each, so a slow GetLoad does not hold up the others).
class SlowWorker final : public iv1::DecodeService::Service {
 public:
  bool Start() {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    builder.RegisterService(this);
    server_ = builder.BuildAndStart();
    return server_ != nullptr && port_ != 0;
  }
  void Shutdown() {
    if (server_ == nullptr) return;
    server_->Shutdown(absl::ToChronoTime(absl::Now()));
    server_.reset();
  }
  std::string address() const { return absl::StrCat("127.0.0.1:", port_); }
  void set_load_delay(absl::Duration d) { load_delay_ms_ = absl::ToInt64Milliseconds(d); }
  int load_calls() const { return load_calls_; }

  grpc::Status GetInfo(grpc::ServerContext*, const iv1::GetInfoRequest*,
                       iv1::WorkerInfo* info) override {
    info->set_worker_id("w0");
    info->set_role(iv1::WORKER_ROLE_DECODE);
    info->set_model_fingerprint(kFingerprint);
    info->mutable_layout()->set_block_size(16);
    info->mutable_layout()->set_dtype(iv1::KV_DTYPE_FP32);
    return grpc::Status::OK;
  }
  grpc::Status GetLoad(grpc::ServerContext* context, const iv1::GetLoadRequest*,
                       iv1::WorkerLoad* load) override {
    ++load_calls_;
    const absl::Time until = absl::Now() + absl::Milliseconds(load_delay_ms_.load());
    while (absl::Now() < until && !context->IsCancelled()) absl::SleepFor(absl::Milliseconds(5));
    load->set_worker_id("w0");
    return grpc::Status::OK;
  }

 private:
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  std::atomic<int64_t> load_delay_ms_{0};
  std::atomic<int> load_calls_{0};
};

class WorkerPoolTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(worker_.Start()); }
  void TearDown() override {
    pool_.reset();
    worker_.Shutdown();
  }

  void StartPool(int max_missed_checks) {
    WorkerPoolOptions options;
    options.health_interval = absl::Milliseconds(20);
    options.rpc_timeout = kTimeout;
    options.max_missed_checks = max_missed_checks;
    options.model_fingerprint = kFingerprint;
    absl::StatusOr<std::unique_ptr<WorkerPool>> pool =
        WorkerPool::Create({worker_.address()}, {}, options, [this](const WorkerSnapshot& w) {
          absl::MutexLock lock(&mu_);
          changes_.push_back(w.healthy);
        });
    ASSERT_TRUE(pool.ok()) << pool.status();
    pool_ = *std::move(pool);
    ASSERT_TRUE(pool_->WaitForDecodeWorker(absl::Seconds(10)));
  }

  // The health changes reported so far (true = joined, false = left).
  std::vector<bool> Changes() {
    absl::MutexLock lock(&mu_);
    return changes_;
  }
  bool WaitUntilLeft(absl::Duration timeout) {
    absl::MutexLock lock(&mu_);
    auto left = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return !changes_.empty() && !changes_.back();
    };
    return mu_.AwaitWithTimeout(absl::Condition(&left), timeout);
  }
  // Waits until the worker has served `n` more GetLoad calls.
  void WaitForChecks(int n) {
    const int target = worker_.load_calls() + n;
    const absl::Time deadline = absl::Now() + absl::Seconds(10);
    while (worker_.load_calls() < target && absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(5));
    }
    ASSERT_GE(worker_.load_calls(), target);
  }

  SlowWorker worker_;
  std::unique_ptr<WorkerPool> pool_;
  absl::Mutex mu_;
  std::vector<bool> changes_ ABSL_GUARDED_BY(mu_);
};

TEST_F(WorkerPoolTest, ABusyWorkerStaysForFewerThanMaxMissedChecks) {
  StartPool(/*max_missed_checks=*/3);
  worker_.set_load_delay(kTimeout * 2);  // every check times out...
  WaitForChecks(2);                      // ... twice (at most: the second may still run)
  worker_.set_load_delay(absl::ZeroDuration());
  WaitForChecks(3);  // answered in time again: the count starts over
  worker_.set_load_delay(kTimeout * 2);
  WaitForChecks(2);
  worker_.set_load_delay(absl::ZeroDuration());
  WaitForChecks(2);
  EXPECT_EQ(Changes(), std::vector<bool>{true});  // joined once, never left
  ASSERT_EQ(pool_->Snapshot().size(), 1u);
  EXPECT_TRUE(pool_->Snapshot()[0].healthy);
}

TEST_F(WorkerPoolTest, AWorkerThatKeepsTimingOutLeaves) {
  StartPool(/*max_missed_checks=*/3);
  worker_.set_load_delay(absl::Seconds(30));
  const absl::Time start = absl::Now();
  ASSERT_TRUE(WaitUntilLeft(absl::Seconds(10)));
  // Three timeouts (and two intervals) at least.
  EXPECT_GE(absl::Now() - start, 3 * kTimeout);
  EXPECT_NE(pool_->Snapshot()[0].last_error.find("GetLoad"), std::string::npos)
      << pool_->Snapshot()[0].last_error;
  worker_.set_load_delay(absl::ZeroDuration());
}

TEST_F(WorkerPoolTest, OneMissedCheckIsEnoughWhenAskedFor) {
  StartPool(/*max_missed_checks=*/1);
  worker_.set_load_delay(absl::Seconds(30));
  ASSERT_TRUE(WaitUntilLeft(absl::Seconds(10)));
  worker_.set_load_delay(absl::ZeroDuration());
}

TEST_F(WorkerPoolTest, AWorkerWhoseStreamsDeliverStaysWhileItsChecksTimeOut) {
  StartPool(/*max_missed_checks=*/1);  // one timeout would take an idle worker out
  worker_.set_load_delay(absl::Seconds(30));
  const absl::Time until = absl::Now() + 4 * (kTimeout + absl::Milliseconds(20));
  while (absl::Now() < until) {  // its streams keep delivering messages
    pool_->NoteActivity(0);
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_EQ(Changes(), std::vector<bool>{true});  // several checks timed out; never left
  EXPECT_GE(worker_.load_calls(), 3);
  // The streams stop: the next timeout takes it out.
  ASSERT_TRUE(WaitUntilLeft(absl::Seconds(10)));
  worker_.set_load_delay(absl::ZeroDuration());
}

TEST_F(WorkerPoolTest, AGoneWorkerLeavesAtOnce) {
  StartPool(/*max_missed_checks=*/100);  // timeouts tolerated; a refused connection is not
  worker_.Shutdown();
  ASSERT_TRUE(WaitUntilLeft(absl::Seconds(10)));
}

TEST_F(WorkerPoolTest, AWorkerWithAnotherKvDtypeStaysOut) {
  WorkerPoolOptions options;
  options.health_interval = absl::Milliseconds(20);
  options.model_fingerprint = kFingerprint;
  options.kv_dtype = iv1::KV_DTYPE_BF16;  // the worker's cache is f32
  absl::StatusOr<std::unique_ptr<WorkerPool>> pool =
      WorkerPool::Create({worker_.address()}, {}, options);
  ASSERT_TRUE(pool.ok()) << pool.status();
  EXPECT_FALSE((*pool)->WaitForDecodeWorker(absl::Milliseconds(300)));
  const std::string error = (*pool)->Snapshot()[0].last_error;
  EXPECT_NE(error.find("KV dtype KV_DTYPE_FP32 != router's KV_DTYPE_BF16"), std::string::npos)
      << error;
}

TEST_F(WorkerPoolTest, RejectsZeroMissedChecks) {
  WorkerPoolOptions options;
  options.max_missed_checks = 0;
  EXPECT_EQ(WorkerPool::Create({worker_.address()}, {}, options).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace pd::router
