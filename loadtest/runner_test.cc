// LoadRunner against the fake Generation server over real gRPC on 127.0.0.1. Counts, bounds and
// ordering that hold however slow the machine is; the one timing assertion (open-loop
// lateness) is a median with a bound far above a loaded machine's wake-up latency.
#include "loadtest/runner.h"

#include <algorithm>
#include <sstream>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "loadtest/metrics.h"
#include "loadtest/target.h"
#include "loadtest/testing/fake_generation_server.h"

namespace pd::loadtest {
namespace {

using testing::FakeGenerationServer;
using testing::FakeGenerationServerOptions;

std::unique_ptr<FakeGenerationServer> StartServer(FakeGenerationServerOptions o = {}) {
  absl::StatusOr<std::unique_ptr<FakeGenerationServer>> s = FakeGenerationServer::Start(o);
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? *std::move(s) : nullptr;
}

std::unique_ptr<Workload> Synthetic(int64_t input_len, int64_t output_len) {
  SyntheticOptions o;
  o.input_len = LengthSpec::Fixed(input_len);
  o.output_len = LengthSpec::Fixed(output_len);
  o.vocab = {3, 1000};
  return *MakeSyntheticWorkload(o);
}

std::unique_ptr<LoadRunner> MakeRunner(const FakeGenerationServer& server, RunnerOptions o) {
  absl::StatusOr<std::unique_ptr<LoadRunner>> r =
      LoadRunner::Create(o, MakeChannels(server.address(), 2));
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? *std::move(r) : nullptr;
}

TEST(RunnerTest, ClosedLoopNeverExceedsConcurrency) {
  FakeGenerationServerOptions so;
  so.token_delay = absl::Microseconds(500);  // streams overlap
  auto server = StartServer(so);
  ASSERT_NE(server, nullptr);
  RunnerOptions o;
  o.arrival = ArrivalMode::kClosed;
  o.concurrency = 4;
  o.num_requests = 40;
  auto runner = MakeRunner(*server, o);
  ASSERT_NE(runner, nullptr);
  std::unique_ptr<Workload> w = Synthetic(20, 6);
  const RunResult r = runner->Run(w.get());
  ASSERT_EQ(r.records.size(), 40u);
  EXPECT_FALSE(r.stopped);
  EXPECT_LE(r.max_in_flight, 4);
  EXPECT_GE(r.max_in_flight, 1);
  EXPECT_LE(server->stats().max_active_streams, 4);
  for (size_t i = 0; i < r.records.size(); ++i) {
    const RequestRecord& rec = r.records[i];
    EXPECT_EQ(rec.index, static_cast<int64_t>(i));
    EXPECT_TRUE(rec.ok()) << rec.error;
    EXPECT_EQ(rec.output_tokens, 6);
    EXPECT_EQ(rec.itl_ns.size(), 5u);
    EXPECT_EQ(rec.input_tokens, 20);
    EXPECT_TRUE(rec.has_usage);
    EXPECT_EQ(rec.prompt_tokens, 20);
    EXPECT_EQ(rec.completion_tokens, 6);
    EXPECT_EQ(rec.finish_reason, "LENGTH");
    EXPECT_LE(rec.start_ns, rec.first_token_ns);
    EXPECT_LE(rec.first_token_ns, rec.end_ns);
  }
  EXPECT_GT(r.duration_ns, 0);
  // The server counts a stream after its own last event, which may follow the client's: drain.
  server->Shutdown();
  EXPECT_EQ(server->stats().succeeded, 40);
  EXPECT_EQ(server->stats().tokens_sent, 40 * 6);
}

TEST(RunnerTest, OpenLoopSendsOnSchedule) {
  // Each reply takes at least 50 ms, ten mean gaps: an open loop must not wait for replies.
  FakeGenerationServerOptions so;
  so.first_token_delay = absl::Milliseconds(50);
  auto server = StartServer(so);
  ASSERT_NE(server, nullptr);
  RunnerOptions o;
  o.arrival = ArrivalMode::kPoisson;
  // 200/s: the 50 arrivals span about 250 ms (the seed fixes the schedule), so a runner that
  // paces wrongly (waits for replies, sleeps for offsets instead of until them) is late by a
  // good part of that span, far more than the bound below.
  o.request_rate = 200;
  o.concurrency = 0;
  o.num_requests = 50;
  auto runner = MakeRunner(*server, o);
  ASSERT_NE(runner, nullptr);
  std::unique_ptr<Workload> w = Synthetic(8, 3);
  const RunResult r = runner->Run(w.get());
  ASSERT_EQ(r.records.size(), 50u);
  EXPECT_EQ(r.records[0].scheduled_ns, 0);
  std::vector<double> lateness_ms;
  for (size_t i = 0; i < r.records.size(); ++i) {
    EXPECT_TRUE(r.records[i].ok()) << r.records[i].error;
    EXPECT_GE(r.records[i].start_ns, r.records[i].scheduled_ns);  // never early
    if (i > 0) {
      EXPECT_GE(r.records[i].scheduled_ns, r.records[i - 1].scheduled_ns);
    }
    lateness_ms.push_back(static_cast<double>(r.records[i].start_ns - r.records[i].scheduled_ns) /
                          1e6);
  }
  // The schedule must span enough time for lateness to mean something.
  const double span_ms = static_cast<double>(r.records.back().scheduled_ns) / 1e6;
  ASSERT_GT(span_ms, 100.0);
  // On time: the median request is sent within 50 ms of its slot. A loaded 2-core machine wakes
  // the issuer within a few ms; one stall only makes the requests scheduled during it late (the
  // runner catches up at once), so the median stays put unless half the run is stalled.
  std::sort(lateness_ms.begin(), lateness_ms.end());
  EXPECT_LT(Percentile(lateness_ms, 50), 50.0)
      << "schedule span " << span_ms << " ms, lateness p90 " << Percentile(lateness_ms, 90)
      << " ms, max " << lateness_ms.back() << " ms";
}

TEST(RunnerTest, TraceArrivalsUseTheTimestamps) {
  auto server = StartServer();
  ASSERT_NE(server, nullptr);
  std::istringstream in(
      "{\"timestamp\": 0, \"input_length\": 600, \"output_length\": 2, \"hash_ids\": [0, 1]}\n"
      "{\"timestamp\": 10, \"input_length\": 100, \"output_length\": 1, \"hash_ids\": [0]}\n"
      "{\"timestamp\": 30, \"input_length\": 700, \"output_length\": 4, \"hash_ids\": [0, 2]}\n");
  TraceOptions to;
  to.time_scale = 0.5;
  absl::StatusOr<Trace> trace = ParseTrace(in, "t", to);
  ASSERT_TRUE(trace.ok()) << trace.status();
  auto w = MakeTraceWorkload(*std::move(trace), {512, {3, 1000}});
  ASSERT_TRUE(w.ok());
  RunnerOptions o;
  o.arrival = ArrivalMode::kTrace;
  o.concurrency = 0;
  auto runner = MakeRunner(*server, o);
  ASSERT_NE(runner, nullptr);
  const RunResult r = runner->Run(w->get());
  ASSERT_EQ(r.records.size(), 3u);
  EXPECT_EQ(r.records[0].scheduled_ns, 0);
  EXPECT_EQ(r.records[1].scheduled_ns, 5'000'000);
  EXPECT_EQ(r.records[2].scheduled_ns, 15'000'000);
  EXPECT_EQ(r.records[2].source_line, 3);
  EXPECT_EQ(r.records[2].input_tokens, 700);
  EXPECT_EQ(r.records[2].output_tokens, 4);
  for (const RequestRecord& rec : r.records) {
    EXPECT_TRUE(rec.ok()) << rec.error;
    EXPECT_GE(rec.start_ns, rec.scheduled_ns);
  }
}

TEST(RunnerTest, FailuresAreCountedByStatusCode) {
  FakeGenerationServerOptions so;
  so.fail_every_n = 3;
  so.fail_code = absl::StatusCode::kResourceExhausted;
  auto server = StartServer(so);
  ASSERT_NE(server, nullptr);
  RunnerOptions o;
  o.concurrency = 3;
  o.num_requests = 30;
  auto runner = MakeRunner(*server, o);
  ASSERT_NE(runner, nullptr);
  std::unique_ptr<Workload> w = Synthetic(8, 4);
  const RunResult r = runner->Run(w.get());
  ASSERT_EQ(r.records.size(), 30u);
  const Summary s = Summarize(r.records, r.duration_ns, Slo{});
  EXPECT_EQ(s.completed, 20);
  EXPECT_EQ(s.failed, 10);
  ASSERT_EQ(s.errors.size(), 1u);
  EXPECT_EQ(s.errors.at("RESOURCE_EXHAUSTED"), 10);
  for (const RequestRecord& rec : r.records) {
    if (!rec.ok()) {
      EXPECT_EQ(rec.error, "injected failure");
      EXPECT_EQ(rec.output_tokens, 0);
    }
  }
}

TEST(RunnerTest, DurationBoundStopsIssuing) {
  FakeGenerationServerOptions so;
  so.token_delay = absl::Microseconds(200);
  auto server = StartServer(so);
  ASSERT_NE(server, nullptr);
  RunnerOptions o;
  o.concurrency = 2;
  o.duration = absl::Milliseconds(100);
  auto runner = MakeRunner(*server, o);
  ASSERT_NE(runner, nullptr);
  std::unique_ptr<Workload> w = Synthetic(8, 4);  // endless: only the duration stops it
  const RunResult r = runner->Run(w.get());
  EXPECT_GE(r.records.size(), 1u);
  for (const RequestRecord& rec : r.records) {
    EXPECT_LT(rec.scheduled_ns, 100'000'000);  // closed loop: when it was issued
    EXPECT_TRUE(rec.ok()) << rec.error;        // requests in flight at the bound completed
  }
}

TEST(RunnerTest, StopCancelsRequestsInFlight) {
  FakeGenerationServerOptions so;
  so.token_delay = absl::Milliseconds(20);  // 1,000 tokens: ~20 s a request
  auto server = StartServer(so);
  ASSERT_NE(server, nullptr);
  RunnerOptions o;
  o.concurrency = 4;
  o.num_requests = 100;
  auto runner = MakeRunner(*server, o);
  ASSERT_NE(runner, nullptr);
  std::unique_ptr<Workload> w = Synthetic(8, 1000);
  RunResult r;
  std::thread t([&] { r = runner->Run(w.get()); });
  // Bounded: if the streams never open, stop and join the runner, then fail (no hang).
  const bool all_open = server->WaitForActiveStreams(4, absl::Seconds(10));
  const int64_t num_open = server->stats().active_streams;
  runner->Stop();
  t.join();
  ASSERT_TRUE(all_open) << "only " << num_open << " of 4 streams opened within 10 s";
  EXPECT_TRUE(r.stopped);
  ASSERT_EQ(r.records.size(), 4u);
  for (const RequestRecord& rec : r.records) {
    EXPECT_TRUE(rec.cancelled_by_client);
    EXPECT_EQ(rec.code, absl::StatusCode::kCancelled);
  }
  EXPECT_EQ(Summarize(r.records, r.duration_ns, Slo{}).cancelled, 4);
}

TEST(RunnerTest, StopBeforeRunSendsNothing) {
  auto server = StartServer();
  ASSERT_NE(server, nullptr);
  RunnerOptions o;
  o.concurrency = 1;
  o.num_requests = 5;
  auto runner = MakeRunner(*server, o);
  ASSERT_NE(runner, nullptr);
  runner->Stop();
  std::unique_ptr<Workload> w = Synthetic(8, 4);
  const RunResult r = runner->Run(w.get());
  EXPECT_TRUE(r.records.empty());
  EXPECT_EQ(server->stats().requests, 0);
}

TEST(RunnerTest, InvalidOptions) {
  RunnerOptions o;
  o.arrival = ArrivalMode::kClosed;
  o.concurrency = 0;
  EXPECT_EQ(o.Validate().code(), absl::StatusCode::kInvalidArgument);
  o.arrival = ArrivalMode::kGamma;
  o.request_rate = 0;
  EXPECT_EQ(o.Validate().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(LoadRunner::Create(RunnerOptions{}, {}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace pd::loadtest
