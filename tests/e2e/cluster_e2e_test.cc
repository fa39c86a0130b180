// The disaggregated cluster as real processes: pd-router -> pd-worker (decode) -> pd-worker
// (prefill) over gRPC, KV over the UCX (or TCP) transport, on loopback, with stories260K.
// Greedy output must equal the single-process engine's, cache hits must not change it, and
// faults must end only the affected streams.
#include <grpcpp/grpcpp.h>
#include <httplib.h>
#include <signal.h>
#include <sys/stat.h>

#include <fstream>
#include <functional>
#include <map>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/notification.h"
#include "common/log/log.h"
#include "common/redis/redis_client.h"
#include "common/testing/net.h"
#include "common/testing/redis_server.h"
#include "common/testing/subprocess.h"
#include "common/testing/temp_dir.h"
#include "engine/runtime/model_runtime.h"
#include "gmock/gmock.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "gtest/gtest.h"
#include "pd/v1/generation.grpc.pb.h"
#include "tests/e2e/cluster_fixture.h"

namespace pd {
namespace {

using ::pd::e2e::Cluster;
using ::pd::e2e::FreePort;
using ::pd::e2e::Generated;
using ::pd::e2e::Reference;
using ::pd::testing::Subprocess;
using ::testing::HasSubstr;

class ClusterE2eTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<pd::testing::TempDir> dir = pd::testing::TempDir::Create("pd-cluster-");
    ASSERT_TRUE(dir.ok()) << dir.status();
    dir_.emplace(*std::move(dir));
  }
  std::string Dir() { return dir_->path(); }
  std::optional<pd::testing::TempDir> dir_;
};

const char* const kPrompts[] = {"Once upon a time", "The cat sat on the mat and",
                                "Lily and Ben went to the park. They saw a big",
                                "One day, a little bird"};

TEST_F(ClusterE2eTest, DisaggregatedGreedyEqualsSingleProcessAndCacheHitsDoNotChangeIt) {
  Reference ref;
  Cluster c(Dir(), 1, 1);
  ASSERT_TRUE(c.WaitReady(absl::Seconds(30))) << c.Logs();
  for (const char* prompt : kPrompts) {
    auto [tokens, text] = ref.Greedy(prompt, 40);
    Generated g = c.GenerateText(prompt, 40);
    ASSERT_TRUE(g.status.ok()) << g.status.error_message() << "\n" << c.Logs();
    EXPECT_EQ(g.tokens, tokens) << prompt;
    EXPECT_EQ(g.text, text) << prompt;
    EXPECT_EQ(g.last.finish_reason(), pdserve::v1::FINISH_REASON_LENGTH);
    EXPECT_EQ(g.last.usage().completion_tokens(), 40u);
    EXPECT_FALSE(g.last.request_id().empty());
  }
  // Two requests sharing a long prefix: the second reuses cached blocks, output unchanged.
  const std::string prefix =
      "Once upon a time, there was a little girl named Lily. She loved to play outside in the "
      "park with her friends. One day,";
  auto [tokens, text] = ref.Greedy(prefix + " she", 24);
  Generated first = c.GenerateText(prefix + " she", 24);
  Generated second = c.GenerateText(prefix + " she", 24);
  ASSERT_TRUE(first.status.ok()) << first.status.error_message();
  ASSERT_TRUE(second.status.ok()) << second.status.error_message();
  EXPECT_EQ(first.tokens, tokens);
  EXPECT_EQ(second.tokens, tokens);
  EXPECT_GT(second.last.usage().cached_tokens(), 0u) << second.last.DebugString();
  EXPECT_EQ(second.last.usage().cached_tokens() % 16, 0u);
  EXPECT_GT(second.last.timings().kv_transfer_us() + first.last.timings().kv_transfer_us(), 0u);

  // The KV came from the prefill worker (metrics of the decode worker).
  const std::string dm = c.WorkerMetrics(1);
  EXPECT_THAT(dm, HasSubstr("pd_worker_prefills_total{where=\"remote\"}")) << dm;
  EXPECT_THAT(c.RouterMetrics(), HasSubstr("pd_router_tokens_total{kind=\"cached\"}"));
}

TEST_F(ClusterE2eTest, BadInputAtTheEdgeIsRejectedClearly) {
  Cluster c(Dir(), 1, 1);
  ASSERT_TRUE(c.WaitReady(absl::Seconds(30))) << c.Logs();
  auto expect = [&](pdserve::v1::GenerateRequest req, grpc::StatusCode code,
                    absl::string_view words) {
    Generated g = c.Generate(req, absl::Seconds(10));
    EXPECT_EQ(g.status.error_code(), code) << g.status.error_message();
    EXPECT_THAT(g.status.error_message(), HasSubstr(std::string(words)));
    EXPECT_EQ(g.messages, 0);
  };
  pdserve::v1::GenerateRequest r;
  expect(r, grpc::StatusCode::INVALID_ARGUMENT, "prompt");
  r.set_text("");
  expect(r, grpc::StatusCode::INVALID_ARGUMENT, "empty");
  r.set_text(std::string(4000, 'a') + " long");  // > 512 tokens of context
  expect(r, grpc::StatusCode::INVALID_ARGUMENT, "context");
  r.set_text("hi");
  r.mutable_sampling()->set_temperature(-1);
  expect(r, grpc::StatusCode::INVALID_ARGUMENT, "temperature");
  r.mutable_sampling()->set_temperature(0);
  r.mutable_sampling()->set_top_p(2);
  expect(r, grpc::StatusCode::INVALID_ARGUMENT, "top_p");
  r.mutable_sampling()->set_top_p(0);
  r.set_model("gpt-17");
  expect(r, grpc::StatusCode::NOT_FOUND, "gpt-17");
  r.clear_model();
  r.set_text(std::string("\xff\xfe bad"));
  expect(r, grpc::StatusCode::INVALID_ARGUMENT, "UTF-8");
  // Invalid UTF-8 in any text field is INVALID_ARGUMENT naming the field. They are `bytes` on
  // the wire: as proto3 `string`s the server's parse failed and gRPC answered UNIMPLEMENTED
  // with no details (issue #39).
  const std::vector<std::pair<std::function<void(pdserve::v1::GenerateRequest*)>, std::string>>
      bad_utf8 = {
          {[](auto* q) { q->set_model("stories\xff"); }, "model: is not valid UTF-8"},
          {[](auto* q) { q->mutable_sampling()->add_stop("x\xc3"); },
           "sampling.stop[0]: is not valid UTF-8"},
          {[](auto* q) { q->set_client_request_id("\xed\xa0\x80"); },
           "client_request_id: is not valid UTF-8"},
          {[](auto* q) { q->set_tenant("t\xfe"); }, "tenant: is not valid UTF-8"},
          {[](auto* q) { q->set_cache_salt("\xc0\xaf"); }, "cache_salt: is not valid UTF-8"},
      };
  for (const auto& [mutate, words] : bad_utf8) {
    pdserve::v1::GenerateRequest q;
    q.set_text("hi");
    mutate(&q);
    expect(q, grpc::StatusCode::INVALID_ARGUMENT, words);
  }
  r.mutable_token_ids()->add_ids(1);
  r.mutable_token_ids()->add_ids(100000);
  expect(r, grpc::StatusCode::INVALID_ARGUMENT, "out of range");
  r.set_text("hi");
  r.mutable_sampling()->set_max_tokens(1u << 30);
  expect(r, grpc::StatusCode::INVALID_ARGUMENT, "max_tokens");
  // Nothing above disturbed a good request.
  Generated ok = c.GenerateText("Once upon a time", 8);
  EXPECT_TRUE(ok.status.ok()) << ok.status.error_message();
  EXPECT_EQ(ok.tokens.size(), 8u);
}

TEST_F(ClusterE2eTest, KilledPrefillWorkerFallsBackToLocalPrefillWithTheSameOutput) {
  Reference ref;
  Cluster c(Dir(), 1, 1);
  ASSERT_TRUE(c.WaitReady(absl::Seconds(30))) << c.Logs();
  auto [tokens, text] = ref.Greedy(kPrompts[2], 32);
  ASSERT_TRUE(c.workers()[0].process->Signal(SIGKILL).ok());
  (void)c.workers()[0].process->Wait(absl::Seconds(10));
  // The router may not have noticed yet: the decode worker falls back to local prefill.
  Generated g = c.GenerateText(kPrompts[2], 32);
  ASSERT_TRUE(g.status.ok()) << g.status.error_message() << "\n" << c.Logs();
  EXPECT_EQ(g.tokens, tokens);
  // Later requests run aggregated on the decode worker once the router dropped the prefill one.
  absl::SleepFor(absl::Seconds(1));
  g = c.GenerateText(kPrompts[0], 16);
  ASSERT_TRUE(g.status.ok()) << g.status.error_message();
  EXPECT_EQ(g.tokens, ref.Greedy(kPrompts[0], 16).first);
}

// With migration off (--max_migrations=0; on, the stream moves instead: migration_e2e_test).
TEST_F(ClusterE2eTest, KilledDecodeWorkerFailsOnlyItsStreamsAndRejoinsAfterRestart) {
  // 5 ms per engine step: a 400-token stream takes > 2 s, long enough to be killed mid-way.
  Cluster c(Dir(), 1, 2, "round_robin", {"--step_delay=5ms"}, {"--max_migrations=0"});
  ASSERT_TRUE(c.WaitReady(absl::Seconds(30))) << c.Logs();
  // A long stream on each decode worker (round robin), then kill decode-0 (worker index 1).
  std::vector<Generated> results(2);
  std::vector<std::thread> streams;
  for (int i = 0; i < 2; ++i) {
    streams.emplace_back([&, i] {
      pdserve::v1::GenerateRequest req;
      req.set_text(kPrompts[i]);
      req.mutable_sampling()->set_max_tokens(400);
      req.mutable_sampling()->set_ignore_eos(true);
      results[i] = c.Generate(req);
    });
  }
  absl::SleepFor(absl::Milliseconds(500));
  ASSERT_TRUE(c.workers()[1].process->Signal(SIGKILL).ok());
  for (auto& t : streams) t.join();
  int failed = 0;
  for (const Generated& g : results) {
    if (!g.status.ok()) {
      ++failed;
      EXPECT_EQ(g.status.error_code(), grpc::StatusCode::UNAVAILABLE) << g.status.error_message();
    }
  }
  EXPECT_EQ(failed, 1);
  // Within 2 s the router routes around it: new requests succeed.
  absl::SleepFor(absl::Seconds(2));
  for (int i = 0; i < 4; ++i) {
    Generated g = c.GenerateText(kPrompts[i], 8);
    EXPECT_TRUE(g.status.ok()) << i << ": " << g.status.error_message();
  }
  // Restart: it rejoins.
  c.RestartWorker(1);
  ASSERT_TRUE(c.WaitReady(absl::Seconds(30))) << c.Logs();
}

// Value of one sample line "name{labels} value" in a Prometheus text page; -1 when absent.
double Metric(const std::string& page, const std::string& series) {
  for (absl::string_view line : absl::StrSplit(page, '\n')) {
    if (absl::StartsWith(line, series + " ")) {
      double v = 0;
      if (absl::SimpleAtod(line.substr(series.size() + 1), &v)) return v;
    }
  }
  return -1;
}

// Waits until `cond` holds or `timeout` passes.
bool Eventually(const std::function<bool()>& cond, absl::Duration timeout = absl::Seconds(10)) {
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    if (cond()) return true;
    absl::SleepFor(absl::Milliseconds(50));
  }
  return cond();
}

// Whether the router's KV index has heard from both workers of a 1P+1D cluster: a block the
// prefill and the decode worker both hold has two entries (index_blocks > 0 alone may be the
// prefill worker's events only, and then a decode placement sees no cached block).
bool IndexHasSharedBlocks(Cluster& c) {
  const std::string m = c.RouterMetrics();
  const double blocks = Metric(m, "pd_router_index_blocks");
  return blocks > 0 && Metric(m, "pd_router_index_entries") > blocks;
}

// Generates `prompt` twice (48 tokens) on a cache-aware 1P+1D cluster: both equal the
// in-process engine's `tokens` and `text`, the first through a remote prefill, the second a
// router-placed cache hit.
void ExpectExactDisaggregatedAndCached(Cluster& c, const std::string& prompt,
                                       const std::vector<uint32_t>& tokens,
                                       const std::string& text) {
  Generated first = c.GenerateText(prompt, 48);
  ASSERT_TRUE(first.status.ok()) << first.status.error_message() << "\n" << c.Logs();
  ASSERT_TRUE(Eventually([&] { return IndexHasSharedBlocks(c); })) << c.RouterMetrics();
  Generated second = c.GenerateText(prompt, 48);
  ASSERT_TRUE(second.status.ok()) << second.status.error_message();
  EXPECT_EQ(first.tokens, tokens);
  EXPECT_EQ(first.text, text);
  EXPECT_EQ(second.tokens, tokens);
  EXPECT_GT(second.last.usage().cached_tokens(), 0u) << second.last.DebugString();
  const std::string dm = c.WorkerMetrics(1);
  EXPECT_THAT(dm, HasSubstr("pd_worker_prefills_total{where=\"remote\"}")) << dm;
  EXPECT_GT(Metric(c.RouterMetrics(), "pd_router_routed_cached_blocks_total"), 0);
}

TEST_F(ClusterE2eTest, RequestWhoseDecodeWorkerDiesBeforeItsFirstTokenIsRetriedElsewhere) {
  Reference ref;
  // One running request per decode worker and no disaggregation: a second request placed on a
  // busy worker waits there without a token until the worker is killed.
  Cluster c(Dir(), 1, 2, "round_robin", {"--step_delay=5ms", "--max_running=1"},
            {"--disagg_threshold_tokens=100000"});
  ASSERT_TRUE(c.WaitReady(absl::Seconds(30))) << c.Logs();
  auto waiting = [&](int i) { return Metric(c.WorkerMetrics(i), "pd_worker_requests_waiting"); };
  auto running = [&] {
    return Metric(c.WorkerMetrics(1), "pd_worker_requests_running") +
           Metric(c.WorkerMetrics(2), "pd_worker_requests_running");
  };
  std::vector<Generated> results(3);
  std::vector<std::thread> streams;
  auto start = [&](int i, const char* prompt, uint32_t max_tokens) {
    streams.emplace_back([&, i, prompt, max_tokens] {
      pdserve::v1::GenerateRequest req;
      req.set_text(prompt);
      req.mutable_sampling()->set_max_tokens(max_tokens);
      req.mutable_sampling()->set_ignore_eos(true);
      results[i] = c.Generate(req);
    });
  };
  // Round robin: long streams on decode-0 and decode-1, then the third request on the first
  // one again, where it queues behind the long stream.
  start(0, kPrompts[0], 400);
  ASSERT_TRUE(Eventually([&] { return running() == 1; })) << c.Logs();
  start(1, kPrompts[1], 400);
  ASSERT_TRUE(Eventually([&] { return running() == 2; })) << c.Logs();
  start(2, kPrompts[2], 8);
  int victim = -1;
  ASSERT_TRUE(Eventually([&] {
    for (int i : {1, 2}) {
      if (waiting(i) == 1) victim = i;
    }
    return victim >= 0;
  })) << c.Logs();
  ASSERT_TRUE(c.workers()[victim].process->Signal(SIGKILL).ok());
  for (auto& t : streams) t.join();
  // The queued request completes on the other worker with the greedy output (a retry); the
  // stream that had already sent tokens moves there too (a migration, migration_e2e_test).
  ASSERT_TRUE(results[2].status.ok()) << results[2].status.error_message() << c.Logs();
  EXPECT_EQ(results[2].tokens, ref.Greedy(kPrompts[2], 8).first);
  EXPECT_TRUE(results[0].status.ok()) << results[0].status.error_message();
  EXPECT_TRUE(results[1].status.ok()) << results[1].status.error_message();
  const std::string m = c.RouterMetrics();
  EXPECT_EQ(Metric(m, "pd_router_retries_total"), 1);
  EXPECT_EQ(Metric(m, R"(pd_router_migrations_total{reason="failure",result="moved"})"), 1) << m;
}

TEST_F(ClusterE2eTest, ClientCancelAndDeadlineFreeTheWorkersBlocks) {
  Cluster c(Dir(), 1, 1, "round_robin", {"--step_delay=5ms"});
  ASSERT_TRUE(c.WaitReady(absl::Seconds(30))) << c.Logs();
  pdserve::v1::GenerateRequest req;
  req.set_text(kPrompts[2]);
  req.mutable_sampling()->set_max_tokens(400);
  req.mutable_sampling()->set_ignore_eos(true);
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
    auto reader = c.api()->Generate(&ctx, req);
    pdserve::v1::GenerateResponse resp;
    int got = 0;
    while (got < 5 && reader->Read(&resp)) got += resp.token_ids_size();
    EXPECT_GT(Metric(c.WorkerMetrics(1), "pd_worker_kv_blocks{state=\"used\"}"), 0);
    ctx.TryCancel();
    while (reader->Read(&resp)) {
    }
    EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::CANCELLED);
  }
  EXPECT_TRUE(Eventually([&] {
    const std::string m = c.WorkerMetrics(1);
    return Metric(m, "pd_worker_kv_blocks{state=\"used\"}") == 0 &&
           Metric(m, "pd_worker_requests_total{rpc=\"Decode.Generate\",code=\"CANCELLED\"}") == 1;
  })) << c.WorkerMetrics(1);

  // timeout_ms ends the stream with DEADLINE_EXCEEDED and frees the blocks too.
  req.set_timeout_ms(300);
  Generated g = c.Generate(req);
  EXPECT_EQ(g.status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED) << g.status.error_message();
  EXPECT_GT(g.tokens.size(), 0u);
  EXPECT_TRUE(Eventually(
      [&] { return Metric(c.WorkerMetrics(1), "pd_worker_kv_blocks{state=\"used\"}") == 0; }));
}

TEST_F(ClusterE2eTest, SigtermDrainsInFlightStreamsThenExits) {
  Reference ref;
  Cluster c(Dir(), 1, 1, "round_robin", {"--step_delay=5ms"});
  ASSERT_TRUE(c.WaitReady(absl::Seconds(30))) << c.Logs();
  Generated g;
  std::thread t([&] { g = c.GenerateText(kPrompts[1], 200); });
  absl::SleepFor(absl::Milliseconds(300));
  ASSERT_TRUE(c.router().Signal(SIGTERM).ok());
  t.join();
  EXPECT_TRUE(g.status.ok()) << g.status.error_message();  // finished during the drain
  EXPECT_EQ(g.tokens, ref.Greedy(kPrompts[1], 200).first);
  absl::StatusOr<pd::testing::ExitInfo> exit = c.router().Wait(absl::Seconds(15));
  ASSERT_TRUE(exit.ok()) << exit.status();
  EXPECT_TRUE(exit->Success()) << exit->ToString();
}

// Many concurrent streams from one client thread (callback API).
class StreamBatch {
 public:
  StreamBatch(pdserve::v1::Generation::Stub* api, int n, uint32_t max_tokens) : calls_(n) {
    for (int i = 0; i < n; ++i) {
      calls_[i] = std::make_unique<Call>(this);
      Call* call = calls_[i].get();
      call->request.set_text(kPrompts[i % 4]);
      call->request.mutable_sampling()->set_max_tokens(max_tokens);
      call->ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(120)));
      api->async()->Generate(&call->ctx, &call->request, call);
      call->StartRead(&call->response);
      call->StartCall();
    }
  }

  // Waits for every stream to end; false if some did not within `timeout`.
  bool Wait(absl::Duration timeout) {
    absl::MutexLock lock(&mu_);
    auto all = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return done_ == static_cast<int>(calls_.size());
    };
    return mu_.AwaitWithTimeout(absl::Condition(&all), timeout);
  }

  std::map<grpc::StatusCode, int> codes() {
    std::map<grpc::StatusCode, int> out;
    for (auto& c : calls_) out[c->status.error_code()]++;
    return out;
  }
  std::string Describe() {
    std::map<std::string, int> by;
    for (auto& c : calls_) {
      by[absl::StrCat(c->status.error_code(), " ", c->status.error_message().substr(0, 80))]++;
    }
    std::string out;
    for (auto& [k, v] : by) absl::StrAppend(&out, v, " x ", k, "\n");
    return out;
  }
  int short_streams(uint32_t expected_tokens) {
    int n = 0;
    for (auto& c : calls_) n += c->status.ok() && c->tokens != expected_tokens;
    return n;
  }

 private:
  struct Call : grpc::ClientReadReactor<pdserve::v1::GenerateResponse> {
    explicit Call(StreamBatch* b) : batch(b) {}
    void OnReadDone(bool ok) override {
      if (!ok) return;
      tokens += response.token_ids_size();
      StartRead(&response);
    }
    void OnDone(const grpc::Status& s) override {
      status = s;
      absl::MutexLock lock(&batch->mu_);
      ++batch->done_;
    }
    StreamBatch* batch;
    grpc::ClientContext ctx;
    pdserve::v1::GenerateRequest request;
    pdserve::v1::GenerateResponse response;
    uint32_t tokens = 0;
    grpc::Status status;
  };

  std::vector<std::unique_ptr<Call>> calls_;
  absl::Mutex mu_;
  int done_ ABSL_GUARDED_BY(mu_) = 0;
};

TEST_F(ClusterE2eTest, ThousandConcurrentStreamsCompleteOrAreRejectedAndNoneHang) {
  Cluster c(Dir(), 1, 1, "round_robin", {"--max_running=32", "--max_batch_tokens=256"},
            {"--max_inflight=400"});
  ASSERT_TRUE(c.WaitReady(absl::Seconds(30))) << c.Logs();
  auto heap = [&] { return Metric(c.RouterMetrics(), "pd_process_heap_inuse_bytes"); };
  // Round 1 warms gRPC's pools and caches to this load; after round 2 the router's heap must
  // be back near where round 1 left it (a leak of 1 KiB per request would show as 1 MiB).
  double baseline = 0;
  for (int round = 0; round < 2; ++round) {
    StreamBatch batch(c.api(), 1000, 8);
    ASSERT_TRUE(batch.Wait(absl::Seconds(120))) << "streams hung\n" << c.Logs();
    std::map<grpc::StatusCode, int> codes = batch.codes();
    EXPECT_EQ(codes[grpc::StatusCode::OK] + codes[grpc::StatusCode::RESOURCE_EXHAUSTED], 1000)
        << batch.Describe() << "\n"
        << c.Logs();
    EXPECT_GT(codes[grpc::StatusCode::OK], 0);
    EXPECT_EQ(batch.short_streams(8), 0);
    EXPECT_TRUE(
        Eventually([&] { return Metric(c.RouterMetrics(), "pd_router_inflight_streams") == 0; }));
    if (round == 0) baseline = heap();
  }
  const double after = heap();
  ASSERT_GT(baseline, 0);
  EXPECT_LT(after - baseline, 1 << 20) << "router heap " << baseline << " -> " << after;
}

// The --max_inflight slot is free before the client sees its stream end: a client sending
// requests one after another is never refused, even at a limit of one stream.
TEST_F(ClusterE2eTest, OneStreamLimitNeverRefusesRequestsSentOneAfterAnother) {
  Cluster c(Dir(), 0, 1, "round_robin", {}, {"--max_inflight=1"});
  ASSERT_TRUE(c.WaitReady(absl::Seconds(30))) << c.Logs();
  for (int i = 0; i < 40; ++i) {
    Generated g = c.GenerateText(absl::StrCat("Once upon a time ", i), 2);
    ASSERT_TRUE(g.status.ok()) << "request " << i << ": " << g.status.error_message();
  }
  // While one stream is open, a second is refused with the limit named.
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
  pdserve::v1::GenerateRequest slow;
  slow.set_text("Once upon a time");
  slow.mutable_sampling()->set_max_tokens(400);
  slow.mutable_sampling()->set_ignore_eos(true);
  auto reader = c.api()->Generate(&ctx, slow);
  pdserve::v1::GenerateResponse first;
  ASSERT_TRUE(reader->Read(&first));  // the stream is open and counted
  Generated refused = c.GenerateText("Once", 2);
  EXPECT_EQ(refused.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_NE(refused.status.error_message().find("--max_inflight"), std::string::npos)
      << refused.status.error_message();
  ctx.TryCancel();
  while (reader->Read(&first)) {
  }
  (void)reader->Finish();  // CANCELLED
  EXPECT_TRUE(
      Eventually([&] { return Metric(c.RouterMetrics(), "pd_router_inflight_streams") == 0; }));
}

// Requests that worker `i` finished with OK, from its metrics.
double DecodeOk(Cluster& c, int i) {
  return std::max(0.0, Metric(c.WorkerMetrics(i),
                              "pd_worker_requests_total{rpc=\"Decode.Generate\",code=\"OK\"}"));
}

TEST_F(ClusterE2eTest, CacheAwarePlacementFollowsThePrefixAndBalancesDistinctOnes) {
  Reference ref;
  Cluster c(Dir(), 2, 2, "cache_aware");
  ASSERT_TRUE(c.WaitReady(absl::Seconds(30))) << c.Logs();
  // Workers 0, 1 prefill; 2, 3 decode.
  const std::string prefix =
      "Once upon a time, there was a little girl named Lily. She loved to play outside in the "
      "park with her friends. One day, she saw a big red ball under a tree and";
  Generated a = c.GenerateText(prefix + " ran to get it.", 8);
  ASSERT_TRUE(a.status.ok()) << a.status.error_message() << c.Logs();
  const int holder = DecodeOk(c, 2) == 1 ? 2 : 3;
  ASSERT_EQ(DecodeOk(c, holder), 1);
  // The router learns where the prefix lives from the workers' KV events: the prefill worker
  // and the decode worker both hold the prompt's full blocks (decode also the blocks its output
  // filled), so only once both streams have delivered them do blocks have two entries.
  ASSERT_TRUE(Eventually([&] { return IndexHasSharedBlocks(c); })) << c.RouterMetrics();
  for (int i = 0; i < 3; ++i) {
    Generated b = c.GenerateText(prefix + " asked her mom.", 8);
    ASSERT_TRUE(b.status.ok()) << b.status.error_message();
    EXPECT_GT(b.last.usage().cached_tokens(), 0u);
    EXPECT_EQ(b.tokens, ref.Greedy(prefix + " asked her mom.", 8).first);
  }
  EXPECT_EQ(DecodeOk(c, holder), 4) << "requests sharing the prefix left the worker holding it";
  EXPECT_THAT(c.RouterMetrics(), HasSubstr("reason=\"cache_hit\""));

  // Many distinct prefixes: the load spreads.
  const double before2 = DecodeOk(c, 2), before3 = DecodeOk(c, 3);
  for (int i = 0; i < 40; ++i) {
    pdserve::v1::GenerateRequest req;
    for (int t = 0; t < 40; ++t) req.mutable_token_ids()->add_ids(3 + (i * 131 + t * 17) % 500);
    req.mutable_sampling()->set_max_tokens(4);
    Generated g = c.Generate(req);
    ASSERT_TRUE(g.status.ok()) << g.status.error_message();
  }
  const double n2 = DecodeOk(c, 2) - before2, n3 = DecodeOk(c, 3) - before3;
  EXPECT_EQ(n2 + n3, 40);
  // The scorer separates equal prompts by the load the workers last reported (every 200 ms), so
  // on a loaded machine a few stale reports tilt it: at least a quarter each, not an even split
  // (11/29 was seen in CI with a 2-core machine under the whole suite).
  EXPECT_LE(std::max(n2, n3) / 20.0, 1.5) << n2 << " vs " << n3;
}

// issue #6 acceptance: redis-server SIGKILLed while the router uses it for lower-tier credit ->
// every request still succeeds with the same output, only the credit lookups fail; Redis back
// -> lookups answer again.
TEST_F(ClusterE2eTest, KilledRedisOnlyRemovesLowerTierCredit) {
  absl::StatusOr<std::unique_ptr<pd::testing::RedisServer>> redis =
      pd::testing::RedisServer::Start({});
  ASSERT_TRUE(redis.ok()) << redis.status();
  Reference ref;
  Cluster c(
      Dir(), 1, 1, "cache_aware", {"--node_name=node-e2e"},
      {absl::StrCat("--redis_address=127.0.0.1:", (*redis)->port()), "--redis_key_prefix=pd:e2e:"});
  ASSERT_TRUE(c.WaitReady(absl::Seconds(30))) << c.Logs();
  auto metric = [&](const std::string& name) { return Metric(c.RouterMetrics(), name); };
  // Prompts of a few full blocks that no worker holds yet (a distinct start each), so every
  // placement asks Redis for the continuation after 0 HBM blocks.
  auto generate_all = [&](int round) {
    for (int i = 0; i < 4; ++i) {
      const std::string prompt = absl::StrCat(
          round, " ", i, " ", kPrompts[i],
          " there was a little girl named Lily. She loved to play outside in the park with her "
          "friends. One day, she saw a big red ball under a tree and");
      Generated g = c.GenerateText(prompt, 6);
      ASSERT_TRUE(g.status.ok()) << g.status.error_message() << "\n" << c.Logs();
      EXPECT_EQ(g.tokens, ref.Greedy(prompt, 6).first) << prompt;
    }
  };

  generate_all(0);
  EXPECT_GE(metric("pd_router_tier_credit_lookups_total"), 4);
  EXPECT_EQ(metric("pd_router_tier_credit_errors_total"), 0);

  // SIGKILL: no chance to close connections.
  redis::RedisConfig config;
  config.port = (*redis)->port();
  absl::StatusOr<std::unique_ptr<redis::RedisClient>> admin = redis::RedisClient::Connect(config);
  ASSERT_TRUE(admin.ok()) << admin.status();
  absl::StatusOr<redis::RedisReply> info = (*admin)->Command({"INFO", "server"});
  ASSERT_TRUE(info.ok()) << info.status();
  int pid = 0;
  for (absl::string_view line : absl::StrSplit(info->str, "\r\n")) {
    if (absl::ConsumePrefix(&line, "process_id:")) {
      ASSERT_TRUE(absl::SimpleAtoi(line, &pid)) << line;
    }
  }
  ASSERT_GT(pid, 0);
  ASSERT_EQ(kill(pid, SIGKILL), 0);
  ASSERT_TRUE((*redis)->Stop().ok());  // reaps it

  generate_all(1);
  EXPECT_GE(metric("pd_router_tier_credit_errors_total"), 1) << c.RouterMetrics();

  // Redis back on the same port: after the breaker's pause, lookups answer again.
  ASSERT_TRUE((*redis)->Restart().ok()) << (*redis)->LogTail();
  const double errors = metric("pd_router_tier_credit_errors_total");
  const double lookups = metric("pd_router_tier_credit_lookups_total");
  int round = 2;
  EXPECT_TRUE(Eventually(
      [&] {
        generate_all(round++);
        return metric("pd_router_tier_credit_breaker_open") == 0 &&
               metric("pd_router_tier_credit_lookups_total") > lookups + 1;
      },
      absl::Seconds(30)))
      << c.RouterMetrics();
  EXPECT_LE(metric("pd_router_tier_credit_errors_total"), errors + 1);
}

// --kv_dtype on every process, for each non-f32 dtype: the output equals the in-process engine
// with the same cache dtype, disaggregated (the prefill worker's blocks, scales included, cross
// the transport) and on a cache hit the router placed by its index (it hashes with the
// workers' dtype). Quantized caches change the text: the check is exact, not approximate.
TEST_F(ClusterE2eTest, KvDtypesAreExactDisaggregatedAndOnCacheHits) {
  struct Case {
    kernels::DType dtype;
    int64_t block_bytes;  // stories260K: 5 layers, 4 kv heads, head_dim 8, 16 tokens
  };
  const Case cases[] = {{kernels::DType::kBF16, 10240},
                        {kernels::DType::kI8, 5120 + 2560},  // 1-byte data + an f32 per row
                        {kernels::DType::kF8E4M3, 5120 + 2560},
                        {kernels::DType::kI4, 2560 + 2560}};  // half-byte data + an f32 per row
  const std::string prompt =
      "Once upon a time, there was a little girl named Lily. She loved to play outside in the "
      "park with her friends. One day, she";
  for (const Case& k : cases) {
    const std::string name(kernels::DTypeName(k.dtype));
    SCOPED_TRACE(name);
    Reference ref(k.dtype);
    auto [tokens, text] = ref.Greedy(prompt, 48);
    const std::string dir = absl::StrCat(Dir(), "/", name);
    ASSERT_EQ(::mkdir(dir.c_str(), 0755), 0);
    const std::string flag = "--kv_dtype=" + name;
    Cluster c(dir, 1, 1, "cache_aware", {flag}, {flag});
    ASSERT_TRUE(c.WaitReady(absl::Seconds(30))) << c.Logs();
    EXPECT_THAT(c.Logs(), HasSubstr(absl::StrCat("dtype=", name, " block_bytes=", k.block_bytes)))
        << c.Logs();
    ExpectExactDisaggregatedAndCached(c, prompt, tokens, text);
  }
  // The quantized caches really change the output (so equality above is not f32's text).
  Reference f32;
  Reference fp8(kernels::DType::kF8E4M3);
  EXPECT_NE(f32.Greedy(prompt, 48).first, fp8.Greedy(prompt, 48).first);
}

// Greedy `max_tokens` tokens of `prompt` through the cluster, past end-of-text tokens.
Generated GenerateToLength(Cluster& c, const std::string& prompt, uint32_t max_tokens) {
  pdserve::v1::GenerateRequest req;
  req.set_text(prompt);
  req.mutable_sampling()->set_max_tokens(max_tokens);
  req.mutable_sampling()->set_ignore_eos(true);
  return c.Generate(req);
}

// The sink + window KV policy on the decode worker: 600 tokens, past stories260K's 512-token
// context, through a remote prefill (the prompt fits without a drop), equal to the in-process
// engine with the same policy; the decode worker dropped blocks and its pool stayed small.
TEST_F(ClusterE2eTest, SinkWindowPolicyIsExactDisaggregatedPastTheContext) {
  const std::string prompt = "Once upon a time, there was a little girl named Lily.";
  Reference ref(kernels::DType::kF32, 16, 64);
  auto [tokens, text] = ref.Greedy(prompt, 600, nullptr, 0, /*ignore_eos=*/true);
  ASSERT_EQ(tokens.size(), 600u);
  Cluster c(Dir(), 1, 1, "round_robin", {"--kv_sink_tokens=16", "--kv_window_tokens=64"});
  ASSERT_TRUE(c.WaitReady(absl::Seconds(30))) << c.Logs();
  Generated got = GenerateToLength(c, prompt, 600);
  ASSERT_TRUE(got.status.ok()) << got.status.error_message() << "\n" << c.Logs();
  EXPECT_EQ(got.tokens, tokens);
  EXPECT_EQ(got.text, text);
  const std::string dm = c.WorkerMetrics(1);
  EXPECT_THAT(dm, HasSubstr("pd_worker_prefills_total{where=\"remote\"} 1")) << dm;
  // (13 + 600 tokens) / 16 = 38 text blocks, 6 held: 32 dropped.
  EXPECT_GE(Metric(dm, "pd_worker_kv_window_dropped_blocks_total"), 30) << dm;
}

// H2O on the decode worker: 600 tokens, past stories260K's 512-token context, with a budget of
// 64 tokens, equal to the in-process engine under the same policy. A governed request is
// prefilled where it decodes (its prompt's scores exist only there), and the worker compacted
// its cache every block past the budget.
TEST_F(ClusterE2eTest, H2oPolicyIsExactPastTheContext) {
  const std::string prompt = "Once upon a time, there was a little girl named Lily.";
  Reference ref(kernels::DType::kF32, 0, 0, engine::WeightDType::kAuto, {"h2o", 64, 32});
  auto [tokens, text] = ref.Greedy(prompt, 600, nullptr, 0, /*ignore_eos=*/true);
  ASSERT_EQ(tokens.size(), 600u);
  Cluster c(Dir(), 1, 1, "round_robin",
            {"--kv_policy=h2o", "--kv_budget_tokens=64", "--kv_recent_tokens=32"});
  ASSERT_TRUE(c.WaitReady(absl::Seconds(30))) << c.Logs();
  Generated got = GenerateToLength(c, prompt, 600);
  ASSERT_TRUE(got.status.ok()) << got.status.error_message() << "\n" << c.Logs();
  EXPECT_EQ(got.tokens, tokens);
  EXPECT_EQ(got.text, text);
  const std::string dm = c.WorkerMetrics(1);
  EXPECT_THAT(dm, HasSubstr("pd_worker_prefills_total{where=\"local\"} 1")) << dm;
  // (13 + 600) tokens, 80 held at most: a compaction of 16 for every block past it.
  EXPECT_GE(Metric(dm, "pd_worker_kv_compactions_total"), 30) << dm;
  EXPECT_EQ(Metric(dm, "pd_worker_kv_evicted_tokens_total"),
            16 * Metric(dm, "pd_worker_kv_compactions_total"))
      << dm;
}

// SnapKV on the decode worker: a prompt of about 150 tokens compressed once to 64, then 80
// tokens generated, equal to the in-process engine under the same policy. The prefill worker
// computes and compresses the prompt (it runs the policy the decode worker sends) and ships
// only the 64 kept tokens' blocks (4, where the whole prompt would take ceil(P / 16)).
TEST_F(ClusterE2eTest, SnapKvPolicyIsExactOnALongPrompt) {
  const std::string prompt =
      "Once upon a time, there was a little girl named Lily. She loved to play outside in the "
      "park with her friends. One day, she saw a big red ball under a tree. She ran to the ball "
      "and picked it up. It was soft and shiny. Lily wanted to show the ball to her mom, so she "
      "ran home as fast as she could. Her mom smiled and said, \"What a pretty ball! Where did "
      "you find it?\" Lily told her mom about the tree in the park. Then they went";
  Reference ref(kernels::DType::kF32, 0, 0, engine::WeightDType::kAuto, {"snapkv", 64, 16});
  auto [tokens, text] = ref.Greedy(prompt, 80, nullptr, 0, /*ignore_eos=*/true);
  ASSERT_EQ(tokens.size(), 80u);
  ASSERT_GT(ref.Encode(prompt).size(), 100u);
  Cluster c(Dir(), 1, 1, "round_robin",
            {"--kv_policy=snapkv", "--kv_budget_tokens=64", "--kv_recent_tokens=16"});
  ASSERT_TRUE(c.WaitReady(absl::Seconds(30))) << c.Logs();
  Generated got = GenerateToLength(c, prompt, 80);
  ASSERT_TRUE(got.status.ok()) << got.status.error_message() << "\n" << c.Logs();
  EXPECT_EQ(got.tokens, tokens);
  EXPECT_EQ(got.text, text);
  const std::string dm = c.WorkerMetrics(1);
  const std::string pm = c.WorkerMetrics(0);
  EXPECT_THAT(dm, HasSubstr("pd_worker_prefills_total{where=\"remote\"} 1")) << dm;
  EXPECT_EQ(Metric(pm, "pd_worker_kv_compactions_total"), 1) << pm;
  EXPECT_EQ(Metric(pm, "pd_worker_kv_evicted_tokens_total"),
            static_cast<double>(ref.Encode(prompt).size()) - 64)
      << pm;
  EXPECT_EQ(Metric(dm, "pd_worker_kv_compactions_total"), 0) << dm;
  // stories260K's f32 block: 5 layers x 4 kv heads x 8 dims x 16 tokens x K and V x 4 bytes.
  EXPECT_EQ(Metric(dm, "pd_worker_kv_transfer_bytes_total{direction=\"in\"}"), 4 * 20480) << dm;
}

// Int8 weights (--weight_dtype=int8 on the router and the workers): a 1P+1D cluster gives the
// in-process int8 engine's output, through a remote prefill and on a router-placed cache hit,
// and it differs from the bf16/f32 weights' output (so equality is not the unquantized text).
TEST_F(ClusterE2eTest, Int8WeightsAreExactDisaggregatedAndOnCacheHits) {
  const std::string prompt =
      "Once upon a time, there was a little girl named Lily. She loved to play outside in the "
      "park with her friends. One day, she";
  Reference ref(kernels::DType::kF32, 0, 0, engine::WeightDType::kInt8);
  auto [tokens, text] = ref.Greedy(prompt, 48);
  Cluster c(Dir(), 1, 1, "cache_aware", {"--weight_dtype=int8"}, {"--weight_dtype=int8"});
  ASSERT_TRUE(c.WaitReady(absl::Seconds(30))) << c.Logs();
  ExpectExactDisaggregatedAndCached(c, prompt, tokens, text);
  Reference unquantized;
  EXPECT_NE(unquantized.Greedy(prompt, 48).first, tokens);
}

}  // namespace
}  // namespace pd
