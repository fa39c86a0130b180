#include "engine/runtime/engine_loop.h"

#include <atomic>
#include <memory>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "engine/runtime/model_runtime.h"
#include "gtest/gtest.h"

namespace pd::engine {
namespace {

std::unique_ptr<ModelRuntime> Stories() {
  ModelRuntimeConfig c;
  c.model = PD_SHARED_DIR "/models/stories260K/stories260K.bin";
  c.tokenizer = PD_SHARED_DIR "/models/stories260K/tok512.bin";
  c.kv_blocks = 128;
  c.threads = 1;
  absl::StatusOr<std::unique_ptr<ModelRuntime>> rt = ModelRuntime::Create(c);
  EXPECT_TRUE(rt.ok()) << rt.status();
  return *std::move(rt);
}

struct Collected {
  absl::Mutex mu;
  std::vector<uint32_t> tokens;
  absl::Notification done;
  GenerationOutput last;
};

GenerationRequest Request(uint64_t id, std::vector<uint32_t> prompt, uint32_t max_tokens,
                          Collected* out) {
  GenerationRequest r;
  r.id = RequestId(id);
  r.prompt = std::move(prompt);
  r.sampling.max_tokens = max_tokens;
  r.on_output = [out](GenerationOutput o) {
    bool last = false;
    {
      absl::MutexLock lock(&out->mu);
      out->tokens.insert(out->tokens.end(), o.new_tokens.begin(), o.new_tokens.end());
      if (o.finish_reason != FinishReason::kNone) {
        out->last = std::move(o);
        last = true;
      }
    }
    if (last) {
      out->done.Notify();  // after unlocking: the waiter may destroy *out at once
    }
  };
  return r;
}

// Posts a command and waits until the loop thread ran it: everything the loop did before
// (steps, their stats) happened before this returns. False if it did not run within 60 s.
bool WaitForLoopTurn(EngineLoop& loop) {
  // Shared by this waiter and the posted command, which may still run after a timeout.
  auto ran = std::make_shared<absl::Notification>();
  loop.Post([ran](Scheduler&) { ran->Notify(); });
  return ran->WaitForNotificationWithTimeout(absl::Seconds(60));
}

TEST(EngineLoopTest, ConcurrentSubmitsGiveSequentialOutputs) {
  std::unique_ptr<ModelRuntime> rt = Stories();
  // Reference: one request at a time.
  std::vector<std::vector<uint32_t>> expected;
  {
    EngineLoop loop(rt->scheduler());
    for (int i = 0; i < 4; ++i) {
      Collected c;
      ASSERT_TRUE(loop.Submit(Request(i + 1, {1, static_cast<uint32_t>(300 + i)}, 24, &c)).ok());
      ASSERT_TRUE(c.done.WaitForNotificationWithTimeout(absl::Seconds(60)));
      expected.push_back(c.tokens);
    }
  }
  EngineLoop loop(rt->scheduler());
  std::vector<Collected> got(4);
  std::vector<std::thread> threads;
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([&, i] {
      EXPECT_TRUE(
          loop.Submit(Request(100 + i, {1, static_cast<uint32_t>(300 + i)}, 24, &got[i])).ok());
    });
  }
  for (auto& t : threads) t.join();
  for (int i = 0; i < 4; ++i) {
    ASSERT_TRUE(got[i].done.WaitForNotificationWithTimeout(absl::Seconds(60)));
    EXPECT_EQ(got[i].tokens, expected[i]) << i;
  }
  // Stats are refreshed after the step that emitted the last output, before the loop runs
  // what was posted after it: once a posted command ran, they include every request.
  ASSERT_TRUE(WaitForLoopTurn(loop));
  EXPECT_EQ(loop.Stats().finished, 8);  // cumulative over both loops
}

// The prefill cost a worker sends tierd (issue #19): unknown until a mostly-prefill step ran,
// then positive; short prompts and decode steps leave it alone.
TEST(EngineLoopTest, MeasuresPrefillTimePerToken) {
  std::unique_ptr<ModelRuntime> rt = Stories();
  EngineLoop loop(rt->scheduler());
  EXPECT_EQ(loop.PrefillSecondsPerToken(), 0);
  {
    Collected c;  // 2 prompt tokens: no sample
    ASSERT_TRUE(loop.Submit(Request(1, {1, 300}, 8, &c)).ok());
    ASSERT_TRUE(c.done.WaitForNotificationWithTimeout(absl::Seconds(60)));
  }
  ASSERT_TRUE(WaitForLoopTurn(loop));
  EXPECT_EQ(loop.PrefillSecondsPerToken(), 0);
  std::vector<uint32_t> prompt = {1};
  for (uint32_t t = 0; t < 100; ++t) prompt.push_back(300 + t % 50);
  Collected c;
  ASSERT_TRUE(loop.Submit(Request(2, prompt, 2, &c)).ok());
  ASSERT_TRUE(c.done.WaitForNotificationWithTimeout(absl::Seconds(60)));
  ASSERT_TRUE(WaitForLoopTurn(loop));
  const double per_token = loop.PrefillSecondsPerToken();
  EXPECT_GT(per_token, 0);
  EXPECT_LT(per_token, 1.0);  // a sanity bound: stories260K computes a token in microseconds
}

TEST(EngineLoopTest, SubmitReportsAdmissionErrorsAndPostRunsOnLoop) {
  std::unique_ptr<ModelRuntime> rt = Stories();
  EngineLoop loop(rt->scheduler());
  Collected c;
  EXPECT_EQ(loop.Submit(Request(1, {}, 4, &c)).code(), absl::StatusCode::kInvalidArgument);
  absl::Notification ran;
  loop.Post([&](Scheduler& s) {
    EXPECT_TRUE(s.idle());
    ran.Notify();
  });
  EXPECT_TRUE(ran.WaitForNotificationWithTimeout(absl::Seconds(10)));
}

TEST(EngineLoopTest, StopCancelsRunningRequestsAndRefusesNewOnes) {
  std::unique_ptr<ModelRuntime> rt = Stories();
  EngineLoop loop(rt->scheduler());
  Collected c;
  ASSERT_TRUE(loop.Submit(Request(1, {1}, 0, &c)).ok());  // runs to the end of the context
  loop.Stop();
  ASSERT_TRUE(c.done.HasBeenNotified());
  EXPECT_EQ(c.last.status.code(), absl::StatusCode::kCancelled);
  Collected d;
  EXPECT_EQ(loop.Submit(Request(2, {1}, 4, &d)).code(), absl::StatusCode::kUnavailable);
}

// SubmitAsync returns before the loop ran the request; a refusal reaches `rejected` (on the
// loop thread), an admitted request its outputs, and after Stop `rejected` runs at once.
TEST(EngineLoopTest, SubmitAsyncReportsRefusalsToTheCallbackAndNeverBoth) {
  std::unique_ptr<ModelRuntime> rt = Stories();
  EngineLoop loop(rt->scheduler());
  struct Refusal {
    absl::Notification done;
    absl::Status status;
    std::thread::id thread;
  };
  auto refusal = std::make_shared<Refusal>();
  Collected bad;
  loop.SubmitAsync(Request(1, {}, 4, &bad), [refusal](const absl::Status& s) {
    refusal->status = s;
    refusal->thread = std::this_thread::get_id();
    refusal->done.Notify();
  });
  ASSERT_TRUE(refusal->done.WaitForNotificationWithTimeout(absl::Seconds(30)));
  EXPECT_EQ(refusal->status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refusal->thread, std::this_thread::get_id());
  EXPECT_FALSE(bad.done.HasBeenNotified());

  Collected good;
  auto wrongly_refused = std::make_shared<std::atomic<bool>>(false);
  loop.SubmitAsync(Request(2, {1, 2, 3}, 4, &good),
                   [wrongly_refused](const absl::Status&) { *wrongly_refused = true; });
  ASSERT_TRUE(good.done.WaitForNotificationWithTimeout(absl::Seconds(30)));
  EXPECT_EQ(good.last.finish_reason, FinishReason::kLength);
  EXPECT_EQ(good.tokens.size(), 4u);
  EXPECT_FALSE(*wrongly_refused);

  loop.Stop();
  absl::Status after_stop;
  Collected late;
  loop.SubmitAsync(Request(3, {1}, 4, &late),
                   [&after_stop](const absl::Status& s) { after_stop = s; });
  EXPECT_EQ(after_stop.code(), absl::StatusCode::kUnavailable);  // ran on this thread
  EXPECT_FALSE(late.done.HasBeenNotified());
}

}  // namespace
}  // namespace pd::engine
