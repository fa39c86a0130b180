// LoadRunner's OpenAI backend against the fake OpenAI server over real HTTP on 127.0.0.1 (and,
// in compare mode, beside the fake gRPC server). No timing assertions beyond "Stop ends
// streams well before their scripted end".
#include "loadtest/openai_client.h"

#include <nlohmann/json.hpp>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/testing/net.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "loadtest/runner.h"
#include "loadtest/target.h"
#include "loadtest/testing/fake_generation_server.h"
#include "loadtest/testing/fake_openai_server.h"

namespace pd::loadtest {
namespace {

using testing::FakeOpenAiServer;
using testing::FakeOpenAiServerOptions;
using ::testing::HasSubstr;

// Decodes id i as "w<i> ": a stand-in for a model's tokenizer.
class WordTokenizer : public engine::Tokenizer {
 public:
  absl::StatusOr<std::vector<uint32_t>> Encode(absl::string_view, bool, bool) const override {
    return absl::UnimplementedError("not needed");
  }
  absl::StatusOr<std::string> DecodeToken(uint32_t, uint32_t next) const override {
    if (next >= vocab_size()) {
      return absl::InvalidArgumentError("out of range");
    }
    return absl::StrCat("w", next, " ");
  }
  uint32_t vocab_size() const override { return 1000; }
  uint32_t bos_id() const override { return 1; }
  uint32_t eos_id() const override { return 2; }
};

std::unique_ptr<FakeOpenAiServer> StartServer(FakeOpenAiServerOptions o = {}) {
  absl::StatusOr<std::unique_ptr<FakeOpenAiServer>> s = FakeOpenAiServer::Start(o);
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

RunnerTarget OpenAiTarget(const std::string& url,
                          OpenAiEndpoint endpoint = OpenAiEndpoint::kCompletions) {
  RunnerTarget t;
  t.backend = Backend::kOpenAi;
  t.openai.url = url;
  t.openai.endpoint = endpoint;
  t.openai.model = "fake-model";
  if (endpoint == OpenAiEndpoint::kChat) {
    t.openai.tokenizer = std::make_shared<const WordTokenizer>();
  }
  return t;
}

RunResult RunOpenAi(const RunnerTarget& target, RunnerOptions o, Workload* w) {
  absl::StatusOr<std::unique_ptr<LoadRunner>> r = LoadRunner::Create(o, target, std::nullopt);
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? (*r)->Run(w) : RunResult{};
}

TEST(OpenAiRunnerTest, ClosedLoopCompletionsRecordsUsageAndChunks) {
  FakeOpenAiServerOptions so;
  so.tokens_per_chunk = 2;
  so.cached_tokens = 16;
  so.token_delay = absl::Microseconds(300);  // streams overlap
  so.comments = true;
  auto server = StartServer(so);
  ASSERT_NE(server, nullptr);
  RunnerOptions o;
  o.concurrency = 4;
  o.num_requests = 24;
  std::unique_ptr<Workload> w = Synthetic(20, 7);
  const RunResult r = RunOpenAi(OpenAiTarget(server->url()), o, w.get());
  ASSERT_EQ(r.records.size(), 24u);
  EXPECT_LE(r.max_in_flight, 4);
  EXPECT_LE(server->stats().max_active_streams, 4);
  for (const RequestRecord& rec : r.records) {
    EXPECT_TRUE(rec.ok()) << StatusCodeName(rec.code) << ": " << rec.error;
    EXPECT_EQ(rec.input_tokens, 20);
    EXPECT_EQ(rec.output_tokens, 7);  // usage, not the 4 chunks
    EXPECT_TRUE(rec.has_usage);
    EXPECT_EQ(rec.prompt_tokens, 20);
    EXPECT_EQ(rec.cached_tokens, 16);
    EXPECT_EQ(rec.finish_reason, "LENGTH");
    EXPECT_EQ(rec.itl_ns.size(), 3u);  // 4 content chunks
    EXPECT_GE(rec.first_token_ns, rec.start_ns);
    EXPECT_GE(rec.end_ns, rec.first_token_ns);
  }
  const nlohmann::json body = nlohmann::json::parse(server->stats().last_body);
  EXPECT_EQ(body["prompt"].size(), 20u);
  EXPECT_EQ(body["max_tokens"], 7);
  EXPECT_EQ(body["ignore_eos"], true);
  EXPECT_EQ(body["temperature"], 0.0);
  const Summary s = Summarize(r.records, r.duration_ns, Slo{});
  EXPECT_EQ(s.completed, 24);
  EXPECT_EQ(s.total_output_tokens, 24 * 7);
  ASSERT_TRUE(s.prefix_cache_hit_ratio.has_value());
  EXPECT_DOUBLE_EQ(*s.prefix_cache_hit_ratio, 16.0 / 20.0);
}

TEST(OpenAiRunnerTest, OpenLoopChatWithCrlfAndRoleChunk) {
  FakeOpenAiServerOptions so;
  so.crlf = true;
  auto server = StartServer(so);
  ASSERT_NE(server, nullptr);
  RunnerOptions o;
  o.arrival = ArrivalMode::kPoisson;
  o.request_rate = 500;
  o.num_requests = 15;
  o.temperature = 0.5;
  o.penalties.frequency_penalty = 0.25;
  o.penalties.min_p = 0.1;
  std::unique_ptr<Workload> w = Synthetic(6, 3);
  const RunResult r = RunOpenAi(OpenAiTarget(server->url(), OpenAiEndpoint::kChat), o, w.get());
  ASSERT_EQ(r.records.size(), 15u);
  for (const RequestRecord& rec : r.records) {
    EXPECT_TRUE(rec.ok()) << StatusCodeName(rec.code) << ": " << rec.error;
    EXPECT_EQ(rec.output_tokens, 3);
    EXPECT_EQ(rec.itl_ns.size(), 2u);  // the role-only chunk is neither TTFT nor ITL
    EXPECT_GT(rec.prompt_tokens, 0);   // the fake counts the text's bytes
  }
  const nlohmann::json body = nlohmann::json::parse(server->stats().last_body);
  ASSERT_EQ(body["messages"].size(), 1u);
  EXPECT_THAT(body["messages"][0]["content"].get<std::string>(), HasSubstr("w"));
  EXPECT_EQ(body["temperature"], 0.5);
  EXPECT_EQ(body["frequency_penalty"], 0.25);  // the runner's penalties reach every request
  EXPECT_EQ(body["min_p"], 0.1);
  EXPECT_FALSE(body.contains("presence_penalty"));
}

struct FailureCase {
  const char* mode;
  int http_status;
  absl::StatusCode code;
  const char* message;
};

TEST(OpenAiRunnerTest, HttpAndStreamErrorsAreRecordedByCode) {
  const FailureCase cases[] = {
      {"http", 429, absl::StatusCode::kResourceExhausted, "HTTP 429: injected failure"},
      {"http", 500, absl::StatusCode::kInternal, "HTTP 500: injected failure"},
      {"malformed", 200, absl::StatusCode::kInternal, "malformed JSON"},
      {"stream_error", 200, absl::StatusCode::kInternal, "injected stream error"},
  };
  for (const FailureCase& c : cases) {
    SCOPED_TRACE(absl::StrCat(c.mode, " ", c.http_status));
    FakeOpenAiServerOptions so;
    so.fail_every_n = 2;
    so.fail_mode = c.mode;
    so.fail_http_status = c.http_status;
    auto server = StartServer(so);
    ASSERT_NE(server, nullptr);
    RunnerOptions o;
    o.concurrency = 1;  // arrival order = request order
    o.num_requests = 6;
    std::unique_ptr<Workload> w = Synthetic(4, 3);
    const RunResult r = RunOpenAi(OpenAiTarget(server->url()), o, w.get());
    ASSERT_EQ(r.records.size(), 6u);
    for (const RequestRecord& rec : r.records) {
      if (rec.index % 2 == 0) {
        EXPECT_TRUE(rec.ok()) << rec.error;
      } else {
        EXPECT_EQ(rec.code, c.code) << rec.error;
        EXPECT_THAT(rec.error, HasSubstr(c.message));
        EXPECT_FALSE(rec.cancelled_by_client);
      }
    }
  }
}

TEST(OpenAiRunnerTest, ConnectionRefusedIsUnavailable) {
  absl::StatusOr<int> port = pd::testing::PickFreeLoopbackPort();
  ASSERT_TRUE(port.ok());
  RunnerOptions o;
  o.concurrency = 2;
  o.num_requests = 4;
  std::unique_ptr<Workload> w = Synthetic(4, 3);
  const RunResult r = RunOpenAi(OpenAiTarget(absl::StrCat("http://127.0.0.1:", *port)), o, w.get());
  ASSERT_EQ(r.records.size(), 4u);
  for (const RequestRecord& rec : r.records) {
    EXPECT_EQ(rec.code, absl::StatusCode::kUnavailable);
    EXPECT_THAT(rec.error, HasSubstr(absl::StrCat("127.0.0.1:", *port)));
  }
}

TEST(OpenAiRunnerTest, StopCancelsStreamsPromptly) {
  FakeOpenAiServerOptions so;
  so.first_token_delay = absl::Seconds(60);  // waiting for the first byte of the body
  auto server = StartServer(so);
  ASSERT_NE(server, nullptr);
  RunnerOptions o;
  o.concurrency = 3;
  o.num_requests = 100;
  absl::StatusOr<std::unique_ptr<LoadRunner>> runner =
      LoadRunner::Create(o, OpenAiTarget(server->url()), std::nullopt);
  ASSERT_TRUE(runner.ok()) << runner.status();
  std::unique_ptr<Workload> w = Synthetic(8, 5);
  RunResult r;
  std::thread t([&] { r = (*runner)->Run(w.get()); });
  // Bounded: if the streams never open, stop and join the runner, then fail (no hang).
  const bool all_open = server->WaitForActiveStreams(3, absl::Seconds(10));
  const int64_t num_open = server->stats().active_streams;
  const absl::Time stop_at = absl::Now();
  (*runner)->Stop();
  t.join();
  ASSERT_TRUE(all_open) << "only " << num_open << " of 3 streams opened within 10 s";
  EXPECT_LT(absl::Now() - stop_at, absl::Seconds(10));  // not the scripted 60 s
  EXPECT_TRUE(r.stopped);
  ASSERT_EQ(r.records.size(), 3u);
  for (const RequestRecord& rec : r.records) {
    EXPECT_TRUE(rec.cancelled_by_client);
    EXPECT_EQ(rec.code, absl::StatusCode::kCancelled);
  }
}

TEST(OpenAiRunnerTest, RequestTimeoutIsDeadlineExceeded) {
  FakeOpenAiServerOptions so;
  so.token_delay = absl::Seconds(60);
  auto server = StartServer(so);
  ASSERT_NE(server, nullptr);
  RunnerOptions o;
  o.concurrency = 1;
  o.num_requests = 1;
  o.request_timeout = absl::Milliseconds(200);
  std::unique_ptr<Workload> w = Synthetic(4, 3);
  const RunResult r = RunOpenAi(OpenAiTarget(server->url()), o, w.get());
  ASSERT_EQ(r.records.size(), 1u);
  EXPECT_EQ(r.records[0].code, absl::StatusCode::kDeadlineExceeded) << r.records[0].error;
  EXPECT_GE(r.records[0].first_token_ns, 0);  // the first chunk came before the deadline
}

TEST(OpenAiRunnerTest, CompareModePairsGrpcWithOpenAi) {
  auto http = StartServer();
  ASSERT_NE(http, nullptr);
  absl::StatusOr<std::unique_ptr<testing::FakeGenerationServer>> grpc =
      testing::FakeGenerationServer::Start({});
  ASSERT_TRUE(grpc.ok()) << grpc.status();
  RunnerTarget a;
  a.channels = MakeChannels((*grpc)->address(), 1);
  RunnerOptions o;
  o.concurrency = 2;
  o.num_requests = 10;
  o.cache_salt = "x/a";
  o.compare_cache_salt = "x/b";
  absl::StatusOr<std::unique_ptr<LoadRunner>> runner =
      LoadRunner::Create(o, a, OpenAiTarget(http->url()));
  ASSERT_TRUE(runner.ok()) << runner.status();
  std::unique_ptr<Workload> w = Synthetic(8, 4);
  const RunResult r = (*runner)->Run(w.get());
  ASSERT_EQ(r.records.size(), 20u);
  for (const RequestRecord& rec : r.records) {
    EXPECT_TRUE(rec.ok()) << rec.target << ": " << rec.error;
    EXPECT_EQ(rec.output_tokens, 4);
  }
  EXPECT_EQ(http->stats().requests, 10);
  EXPECT_EQ((*grpc)->stats().requests, 10);
  // openai_cache_salt unset: the salt is not sent to the HTTP target.
  EXPECT_FALSE(nlohmann::json::parse(http->stats().last_body).contains("cache_salt"));
}

TEST(OpenAiProbeTest, ModelsKeysAndUnreachableTargets) {
  FakeOpenAiServerOptions so;
  so.api_key = "sk-test";
  so.max_model_len = 2048;
  auto server = StartServer(so);
  ASSERT_NE(server, nullptr);
  OpenAiClientOptions o;
  o.url = absl::StrCat(server->url(), "/v1");
  o.api_key = "sk-test";
  absl::StatusOr<OpenAiModel> m = ProbeOpenAiTarget(o, "");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->id, "fake-model");
  EXPECT_EQ(m->max_model_len, 2048);
  EXPECT_EQ(ProbeOpenAiTarget(o, "other").status().code(), absl::StatusCode::kNotFound);
  o.api_key = "wrong";
  const absl::Status s = ProbeOpenAiTarget(o, "").status();
  EXPECT_EQ(s.code(), absl::StatusCode::kUnauthenticated);
  EXPECT_THAT(s.message(), HasSubstr("HTTP 401: invalid api key"));

  absl::StatusOr<int> port = pd::testing::PickFreeLoopbackPort();
  ASSERT_TRUE(port.ok());
  o.url = absl::StrCat("http://127.0.0.1:", *port);
  o.connect_timeout = absl::Milliseconds(300);
  const absl::Status u = ProbeOpenAiTarget(o, "").status();
  EXPECT_EQ(u.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(u.message(), HasSubstr("cannot connect to target"));
}

TEST(OpenAiClientTest, ChatNeedsATokenizer) {
  OpenAiClientOptions o;
  o.url = "http://127.0.0.1:1";
  o.endpoint = OpenAiEndpoint::kChat;
  EXPECT_THAT(o.Validate().message(), HasSubstr("--tokenizer"));
}

}  // namespace
}  // namespace pd::loadtest
