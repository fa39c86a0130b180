// No stream lost (issue #32, docs/migration.md): a decode worker killed with SIGKILL, or drained
// with SIGTERM, while 64 streams run; every stream completes, and its tokens, text and usage
// are those of an undisturbed run of the same requests: greedy and seeded-sampled, with stop
// strings holding text back, over gRPC and over the OpenAI API (SSE). Real processes: pd-router,
// one prefill and two decode pd-workers sharing their node's pd-tierd, on loopback.
#include <grpcpp/grpcpp.h>
#include <httplib.h>
#include <signal.h>

#include <functional>
#include <iostream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/testing/subprocess.h"
#include "common/testing/temp_dir.h"
#include "engine/tools/make_model.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/e2e/cluster_fixture.h"

namespace pd {
namespace {

using ::pd::e2e::Cluster;
using ::pd::e2e::Generated;
using ::pd::e2e::Metric;

constexpr int kGrpcStreams = 56;
constexpr int kSseStreams = 8;  // 64 streams in all

const char* const kPrompts[] = {"Once upon a time", "The cat sat on the mat and",
                                "Lily and Ben went to the park. They saw a big",
                                "One day, a little bird"};

// Stream i: greedy or seeded-sampled (every other one), lengths spread so that one kill lands
// at a different point of each, and a few stop strings that hold text back without matching.
pdserve::v1::GenerateRequest GrpcRequest(int i, uint32_t max_tokens) {
  pdserve::v1::GenerateRequest req;
  req.set_text(kPrompts[i % 4]);
  pdserve::v1::SamplingParams* s = req.mutable_sampling();
  s->set_max_tokens(max_tokens + 7 * (i % 9));
  s->set_ignore_eos(true);
  if (i % 2 == 1) {
    s->set_temperature(0.8f);
    s->set_top_p(0.95f);
    s->set_seed(1000 + i);
  }
  if (i % 3 == 0) {
    s->add_stop("the dragon king");
    s->add_stop("a big purple");
  }
  return req;
}

nlohmann::json SseRequest(int i, uint32_t max_tokens) {
  nlohmann::json req = {{"model", "stories260K"},
                        {"prompt", kPrompts[i % 4]},
                        {"max_tokens", max_tokens + 11 * i},
                        {"ignore_eos", true},
                        {"stream", true},
                        {"stream_options", {{"include_usage", true}}}};
  if (i % 2 == 1) {
    req["temperature"] = 0.7;
    req["seed"] = 77 + i;
  } else {
    req["temperature"] = 0;
  }
  return req;
}

// One SSE completion read to its end: its text, finish reason and usage, or what went wrong.
struct SseResult {
  std::string text;
  std::string finish_reason;
  int completion_tokens = -1;
  std::string error;
  bool done = false;
};

SseResult StreamCompletion(int port, const nlohmann::json& req) {
  httplib::Client http("127.0.0.1", port);
  http.set_read_timeout(120, 0);
  httplib::Result res = http.Post("/v1/completions", req.dump(), "application/json");
  SseResult out;
  if (!res || res->status != 200) {
    out.error = res ? absl::StrCat("status ", res->status, ": ", res->body)
                    : absl::StrCat("http error ", httplib::to_string(res.error()));
    return out;
  }
  for (absl::string_view line : absl::StrSplit(res->body, '\n')) {
    if (!absl::ConsumePrefix(&line, "data: ")) continue;
    if (line == "[DONE]") {
      out.done = true;
      continue;
    }
    const nlohmann::json chunk = nlohmann::json::parse(line, nullptr, false);
    if (!chunk.is_object()) {
      out.error = absl::StrCat("bad chunk: ", line);
      return out;
    }
    if (chunk.contains("error")) {
      out.error = chunk["error"].dump();
      return out;
    }
    if (chunk.contains("choices") && !chunk["choices"].empty()) {
      const nlohmann::json& c = chunk["choices"][0];
      out.text += c.value("text", "");
      if (c.contains("finish_reason") && c["finish_reason"].is_string()) {
        out.finish_reason = c["finish_reason"].get<std::string>();
      }
    }
    if (chunk.contains("usage") && chunk["usage"].is_object()) {
      out.completion_tokens = chunk["usage"].value("completion_tokens", -1);
    }
  }
  if (!out.done) out.error = "stream ended without [DONE]";
  return out;
}

// What a batch of 64 concurrent streams produced.
struct Batch {
  std::vector<Generated> grpc;
  std::vector<SseResult> sse;
};

// Runs the 64 streams at once; `during` runs meanwhile (the fault), then every stream is read
// to its end.
Batch RunStreams(Cluster& c, uint32_t max_tokens, const std::function<void()>& during) {
  Batch b;
  b.grpc.resize(kGrpcStreams);
  b.sse.resize(kSseStreams);
  std::vector<std::thread> threads;
  for (int i = 0; i < kGrpcStreams; ++i) {
    threads.emplace_back(
        [&, i] { b.grpc[i] = c.Generate(GrpcRequest(i, max_tokens), absl::Seconds(120)); });
  }
  for (int i = 0; i < kSseStreams; ++i) {
    threads.emplace_back(
        [&, i] { b.sse[i] = StreamCompletion(c.http_port(), SseRequest(i, max_tokens)); });
  }
  during();
  for (std::thread& t : threads) t.join();
  return b;
}

// Every stream of `got` completed and equals its undisturbed twin in `want`.
void ExpectSameStreams(const Batch& want, const Batch& got, const std::string& what) {
  for (int i = 0; i < kGrpcStreams; ++i) {
    const Generated& w = want.grpc[i];
    const Generated& g = got.grpc[i];
    ASSERT_TRUE(w.status.ok()) << what << " undisturbed stream " << i << ": "
                               << w.status.error_message();
    EXPECT_TRUE(g.status.ok()) << what << " stream " << i << ": " << g.status.error_message();
    EXPECT_EQ(g.tokens, w.tokens) << what << " stream " << i;
    EXPECT_EQ(g.text, w.text) << what << " stream " << i;
    EXPECT_EQ(g.last.finish_reason(), w.last.finish_reason()) << what << " stream " << i;
    EXPECT_EQ(g.last.usage().completion_tokens(), w.tokens.size()) << what << " stream " << i;
    EXPECT_EQ(g.last.usage().prompt_tokens(), w.last.usage().prompt_tokens()) << what << i;
  }
  for (int i = 0; i < kSseStreams; ++i) {
    const SseResult& w = want.sse[i];
    const SseResult& g = got.sse[i];
    ASSERT_TRUE(w.error.empty()) << what << " undisturbed SSE stream " << i << ": " << w.error;
    EXPECT_TRUE(g.error.empty()) << what << " SSE stream " << i << ": " << g.error;
    EXPECT_EQ(g.text, w.text) << what << " SSE stream " << i;
    EXPECT_EQ(g.finish_reason, w.finish_reason) << what << " SSE stream " << i;
    EXPECT_EQ(g.completion_tokens, w.completion_tokens) << what << " SSE stream " << i;
  }
}

class MigrationE2eTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<pd::testing::TempDir> dir = pd::testing::TempDir::Create("pd-migration-");
    ASSERT_TRUE(dir.ok()) << dir.status();
    dir_.emplace(*std::move(dir));
  }
  std::optional<pd::testing::TempDir> dir_;
};

TEST_F(MigrationE2eTest, KilledAndDrainedDecodeWorkersLoseNoStream) {
  // 10 ms per engine step: a 200-token stream takes over 2 s, a 450-token one over 4.5 s.
  // --drain_timeout=30s: a drain that waited for its streams would take seconds, not return
  // at the fixture's 2 s bound.
  // One node's pd-tierd, no write-through: a drained worker offers its streams' blocks to it
  // before it hands them over.
  e2e::Tierd tierd(dir_->path(), {"--dram_mib=64"});
  Cluster c(dir_->path(), 1, 2, "round_robin",
            {"--step_delay=10ms", "--kv_blocks=1024", "--drain_timeout=30s",
             "--tierd_address=" + tierd.address()},
            {absl::StrCat("--http_address=127.0.0.1:", e2e::kHttpPort)});
  ASSERT_TRUE(c.WaitReady(absl::Seconds(60))) << c.Logs();
  const uint32_t seed = std::random_device{}();
  std::cout << "fault times drawn with seed " << seed << "\n";
  std::mt19937 rng(seed);

  // SIGKILL: decode-0 (worker 1) dies at a random point while the streams run.
  const Batch undisturbed = RunStreams(c, 200, [] {});
  const absl::Duration kill_at = absl::Milliseconds(400 + rng() % 1200);
  const Batch killed = RunStreams(c, 200, [&] {
    absl::SleepFor(kill_at);
    ASSERT_TRUE(c.workers()[1].process->Signal(SIGKILL).ok());
  });
  std::cout << "decode-0 killed " << kill_at << " after the streams started\n";
  ExpectSameStreams(undisturbed, killed, "SIGKILL");
  const std::string m = c.RouterMetrics();
  const double moved = Metric(m, R"(pd_router_migrations_total{reason="failure",result="moved"})");
  std::cout << "streams moved: " << moved << "\n";
  EXPECT_GE(moved, 1) << m;
  EXPECT_EQ(Metric(m, R"(pd_router_requests_total{method="Generate",code="UNAVAILABLE"})", 0), 0)
      << m;
  // The surviving decode worker (worker 2) counts where the moved streams' KV came from.
  const std::string w2 = c.WorkerMetrics(2);
  double resumed = 0;
  for (const char* source : {"pool", "tier", "computed"}) {
    const double n =
        Metric(w2, absl::StrCat("pd_worker_resumed_tokens_total{source=\"", source, "\"}"), -1);
    EXPECT_GE(n, 0) << source << " missing:\n" << w2;
    std::cout << "resumed tokens from " << source << ": " << n << "\n";
    resumed += n;
  }
  EXPECT_GT(resumed, 0) << w2;

  // SIGTERM: decode-0 back; decode-1 (worker 2) drains by handing its streams over, and exits
  // within 5 s although its streams had seconds left to run.
  c.RestartWorker(1);
  ASSERT_TRUE(c.WaitReady(absl::Seconds(60))) << c.Logs();
  const Batch long_undisturbed = RunStreams(c, 450 - 7 * 8, [] {});
  const absl::Duration term_at = absl::Milliseconds(800 + rng() % 800);
  absl::Duration drain_took;
  const Batch drained = RunStreams(c, 450 - 7 * 8, [&] {
    absl::SleepFor(term_at);
    const absl::Time start = absl::Now();
    ASSERT_TRUE(c.workers()[2].process->Signal(SIGTERM).ok());
    absl::StatusOr<pd::testing::ExitInfo> exit = c.workers()[2].process->Wait(absl::Seconds(20));
    drain_took = absl::Now() - start;
    ASSERT_TRUE(exit.ok()) << exit.status();
    EXPECT_TRUE(exit->Success()) << exit->ToString();
  });
  std::cout << "decode-1 drained in " << drain_took << " (SIGTERM " << term_at
            << " after the streams started)\n";
  EXPECT_LT(drain_took, absl::Seconds(5));
  ExpectSameStreams(long_undisturbed, drained, "SIGTERM");
  const std::string m2 = c.RouterMetrics();
  EXPECT_GE(Metric(m2, R"(pd_router_migrations_total{reason="drain",result="moved"})"), 1) << m2;
  EXPECT_GE(Metric(m2, "pd_router_migration_stall_seconds_count"), 2) << m2;
  // Before handing its streams over, decode-1 offered their blocks to the node's tier, and
  // decode-0 (restarted: its counters are this phase's) restored moved streams from there.
  const std::string drain_log = c.workers()[2].process->ReadLog();
  const size_t offered_at = drain_log.find("drain: offered the running streams'");
  ASSERT_NE(offered_at, std::string::npos) << drain_log;
  std::cout << drain_log.substr(offered_at, drain_log.find('\n', offered_at) - offered_at) << "\n";
  const std::string w1 = c.WorkerMetrics(1);
  const double from_tier = Metric(w1, R"(pd_worker_resumed_tokens_total{source="tier"})", -1);
  std::cout << "after the drain, resumed tokens from the tier: " << from_tier << " of "
            << from_tier + Metric(w1, R"(pd_worker_resumed_tokens_total{source="computed"})", 0) +
                   Metric(w1, R"(pd_worker_resumed_tokens_total{source="pool"})", 0)
            << "\n";
  EXPECT_GT(from_tier, 0) << w1;
}

// The issue's drain figure with long generations: a random-weight pd-make-model checkpoint with a
// real vocabulary size (32,000 tokens, most of whose pieces are byte fallbacks and partial
// characters: seams land inside characters) and a 2,048-token context; 16 streams of 1,000
// tokens, greedy and seeded, on two decode workers. SIGTERM one worker mid-way: it exits within
// 5 s and every stream equals its undisturbed twin, text included.
TEST_F(MigrationE2eTest, DrainWithThousandTokenStreamsInFlight) {
  engine::MakeModelOptions o;
  o.out_dir = dir_->path() + "/model";
  o.preset = "tiny";
  o.vocab_size = 32000;
  o.max_position_embeddings = 2048;
  o.seed = 32;
  absl::StatusOr<engine::MakeModelResult> made = engine::MakeModel(o);
  ASSERT_TRUE(made.ok()) << made.status();
  Cluster c(dir_->path(), 0, 2, "round_robin",
            {"--step_delay=2ms", "--kv_blocks=2048", "--drain_timeout=30s"}, {}, nullptr, nullptr,
            e2e::ModelFiles{o.out_dir, ""});
  ASSERT_TRUE(c.WaitReady(absl::Seconds(60))) << c.Logs();
  constexpr int kStreams = 16;
  auto run = [&](const std::function<void()>& during) {
    std::vector<Generated> out(kStreams);
    std::vector<std::thread> threads;
    for (int i = 0; i < kStreams; ++i) {
      threads.emplace_back([&, i] {
        pdserve::v1::GenerateRequest req;
        for (uint32_t t : {made->config.bos_id, 300u + 7 * i, 301u + 13 * i}) {
          req.mutable_token_ids()->add_ids(t);
        }
        req.mutable_sampling()->set_max_tokens(1000);
        req.mutable_sampling()->set_ignore_eos(true);
        if (i % 2 == 1) {
          req.mutable_sampling()->set_temperature(1.0f);
          req.mutable_sampling()->set_seed(500 + i);
        }
        out[i] = c.Generate(req, absl::Seconds(180));
      });
    }
    during();
    for (std::thread& t : threads) t.join();
    return out;
  };
  const absl::Time start = absl::Now();
  const std::vector<Generated> undisturbed = run([] {});
  const absl::Duration undisturbed_took = absl::Now() - start;
  absl::Duration drain_took;
  const std::vector<Generated> drained = run([&] {
    absl::SleepFor(undisturbed_took / 4);
    const absl::Time t0 = absl::Now();
    ASSERT_TRUE(c.workers()[1].process->Signal(SIGTERM).ok());
    absl::StatusOr<pd::testing::ExitInfo> exit = c.workers()[1].process->Wait(absl::Seconds(30));
    drain_took = absl::Now() - t0;
    ASSERT_TRUE(exit.ok()) << exit.status();
    EXPECT_TRUE(exit->Success()) << exit->ToString();
  });
  std::cout << "1,000-token streams take " << undisturbed_took
            << " undisturbed; decode-1 drained in " << drain_took << "\n";
  EXPECT_LT(drain_took, absl::Seconds(5));
  for (int i = 0; i < kStreams; ++i) {
    ASSERT_TRUE(undisturbed[i].status.ok()) << i << ": " << undisturbed[i].status.error_message();
    EXPECT_TRUE(drained[i].status.ok()) << i << ": " << drained[i].status.error_message();
    EXPECT_EQ(drained[i].tokens.size(), 1000u) << i;
    EXPECT_EQ(drained[i].tokens, undisturbed[i].tokens) << i;
    EXPECT_EQ(drained[i].text, undisturbed[i].text) << i;
  }
  EXPECT_GE(
      Metric(c.RouterMetrics(), R"(pd_router_migrations_total{reason="drain",result="moved"})"), 1);
}

}  // namespace
}  // namespace pd
