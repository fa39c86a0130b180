// pd-router's OpenAI HTTP API on a real disaggregated cluster (stories260K, API keys on):
// greedy text over HTTP equals the reference engine and the gRPC API, curl reads the raw SSE,
// every bad request of a catalogue gets its status and error object, and the official `openai`
// Node SDK (tests/e2e/openai, installed by scripts/setup.sh) drives completions, chat, streaming,
// errors and a mid-stream disconnect, after which the decode worker has freed the request.
// Idle connections cost the router no CPU and close at the idle timeout; pipelined and trickled
// requests on one connection are all answered.
#include <httplib.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <string>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/testing/net.h"
#include "common/testing/subprocess.h"
#include "common/testing/temp_dir.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/e2e/cluster_fixture.h"

namespace pd {
namespace {

using ::pd::e2e::Cluster;
using ::pd::e2e::Metric;
using ::pd::e2e::Reference;
using ::pd::testing::Subprocess;
using ::testing::HasSubstr;
using json = nlohmann::json;

constexpr char kKey[] = "sk-pdserve-e2e-0123456789abcdef";
constexpr char kPrompt[] = "Once upon a time";
constexpr uint32_t kMaxTokens = 24;
// The router's --http_idle_timeout: above the Node client's own keep-alive (4 s), so the SDK's
// connections are closed by the client first; long enough to measure idle connections.
constexpr absl::Duration kIdleTimeout = absl::Seconds(8);
// A chat template for stories260K (llama2.c models carry none): the router renders it with the
// same Jinja engine it uses for Hugging Face models.
constexpr char kTemplate[] =
    "{% for m in messages %}{{ m['role'] | upper }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}ASSISTANT:{% endif %}";

void WriteFile(const std::string& path, const std::string& contents) {
  std::ofstream out(path);
  out << contents;
  ASSERT_TRUE(out.good()) << path;
}

// One HTTP/1.1 response with a Content-Length body read off `fd` ("" when the connection ends
// or nothing comes for 10 s). `rest` keeps what was read past it (the next pipelined response).
std::string ReadResponse(int fd, std::string* rest) {
  std::string& reply = *rest;
  for (;;) {
    const size_t head = reply.find("\r\n\r\n");
    if (head != std::string::npos) {
      const size_t at = reply.find("Content-Length: ");
      const size_t end = at == std::string::npos || at > head
                             ? head + 4
                             : head + 4 + std::stoul(reply.substr(at + 16));
      if (reply.size() >= end) {
        std::string one = reply.substr(0, end);
        reply.erase(0, end);
        return one;
      }
    }
    pollfd p = {fd, POLLIN, 0};
    if (::poll(&p, 1, 10000) != 1) return "";
    char buf[1024];
    const ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) return "";
    reply.append(buf, static_cast<size_t>(n));
  }
}

class OpenAiE2eTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<pd::testing::TempDir> dir = pd::testing::TempDir::Create("pd-openai-");
    ASSERT_TRUE(dir.ok()) << dir.status();
    dir_.emplace(*std::move(dir));
    WriteFile(Path("keys"), absl::StrCat("default:", kKey, "\n"));
    WriteFile(Path("chat.jinja"), kTemplate);
    cluster_.emplace(
        dir_->path(), 1, 1, "round_robin", std::vector<std::string>{},
        std::vector<std::string>{
            absl::StrCat("--http_address=127.0.0.1:", pd::e2e::kHttpPort),
            "--api_keys_file=" + Path("keys"), "--chat_template=" + Path("chat.jinja"),
            "--http_max_body_bytes=65536",
            absl::StrCat("--http_idle_timeout=", absl::ToInt64Seconds(kIdleTimeout), "s")});
    http_port_ = cluster_->http_port();
    cluster_->set_api_key(kKey);
    ASSERT_TRUE(cluster_->WaitReady(absl::Seconds(60))) << cluster_->Logs();
  }

  std::string Path(const std::string& name) { return absl::StrCat(dir_->path(), "/", name); }

  httplib::Result Post(const std::string& path, const std::string& body,
                       const std::string& key = kKey) {
    httplib::Client http("127.0.0.1", http_port_);
    http.set_read_timeout(60, 0);
    httplib::Headers headers;
    if (!key.empty()) headers.emplace("Authorization", absl::StrCat("Bearer ", key));
    return http.Post(path.c_str(), headers, body, "application/json");
  }

  std::optional<pd::testing::TempDir> dir_;
  std::optional<Cluster> cluster_;
  int http_port_ = 0;
};

TEST_F(OpenAiE2eTest, GreedyTextEqualsTheEngineAndGrpc) {
  Reference ref;
  const std::string expected = ref.Greedy(kPrompt, kMaxTokens).second;
  const e2e::Generated grpc_out = cluster_->GenerateText(kPrompt, kMaxTokens);
  ASSERT_TRUE(grpc_out.status.ok()) << grpc_out.status.error_message();
  ASSERT_EQ(grpc_out.text, expected);

  const json req = {{"model", "stories260K"},
                    {"prompt", kPrompt},
                    {"max_tokens", kMaxTokens},
                    {"temperature", 0}};
  httplib::Result res = Post("/v1/completions", req.dump());
  ASSERT_TRUE(res) << cluster_->Logs();
  ASSERT_EQ(res->status, 200) << res->body;
  const json body = json::parse(res->body);
  EXPECT_EQ(body["choices"][0]["text"], expected);
  EXPECT_EQ(body["usage"]["completion_tokens"], kMaxTokens);
  EXPECT_TRUE(absl::StartsWith(body["id"].get<std::string>(), "cmpl-"));

  // The same prompt as token ids (the tokenizer's ids, BOS included) gives the same text.
  json by_ids = req;
  by_ids["prompt"] = ref.Encode(kPrompt);
  res = Post("/v1/completions", by_ids.dump());
  ASSERT_TRUE(res && res->status == 200) << (res ? res->body : "no response");
  EXPECT_EQ(json::parse(res->body)["choices"][0]["text"], expected);

  // Raw SSE through curl: data lines, the text in order, a usage chunk, [DONE].
  json stream_req = req;
  stream_req["stream"] = true;
  stream_req["stream_options"] = {{"include_usage", true}};
  WriteFile(Path("stream.json"), stream_req.dump());
  absl::StatusOr<Subprocess> curl = Subprocess::Spawn(
      {"/usr/bin/curl", "-sN", "--max-time", "60", "-H",
       absl::StrCat("Authorization: Bearer ", kKey), "-H", "Content-Type: application/json",
       "--data-binary", "@" + Path("stream.json"), "-o", Path("stream.out"),
       absl::StrCat("http://127.0.0.1:", http_port_, "/v1/completions")},
      Path("curl.log"));
  ASSERT_TRUE(curl.ok()) << curl.status();
  absl::StatusOr<pd::testing::ExitInfo> exit = curl->Wait(absl::Seconds(90));
  ASSERT_TRUE(exit.ok() && exit->Success()) << curl->ReadLog();
  std::ifstream in(Path("stream.out"));
  const std::string sse((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::string streamed;
  bool done = false, usage = false;
  for (absl::string_view event : absl::StrSplit(sse, "\n\n", absl::SkipEmpty())) {
    ASSERT_TRUE(absl::StartsWith(event, "data: ")) << sse;
    const absl::string_view data = event.substr(6);
    if (data == "[DONE]") {
      done = true;
      continue;
    }
    const json chunk = json::parse(data);
    if (chunk.contains("usage") && chunk["usage"].is_object()) usage = true;
    for (const json& c : chunk["choices"]) streamed += c["text"].get<std::string>();
  }
  EXPECT_EQ(streamed, expected);
  EXPECT_TRUE(done) << sse;
  EXPECT_TRUE(usage) << sse;
}

// Logprobs travel from the engine through both workers (the first token's entry is computed
// by the prefill worker, the rest by the decode worker) and the router to the client: the
// completions values equal the in-process engine's bit for bit (a float survives JSON's
// double), and the chat stream's entries name the tokens that make up its text.
TEST_F(OpenAiE2eTest, LogprobsEqualTheEngine) {
  constexpr int kTop = 3;
  Reference ref;
  std::vector<engine::TokenLogprob> expected;
  const auto [tokens, text] = ref.Greedy(kPrompt, kMaxTokens, &expected, kTop);
  ASSERT_EQ(expected.size(), tokens.size());

  const json req = {{"model", "stories260K"},
                    {"prompt", kPrompt},
                    {"max_tokens", kMaxTokens},
                    {"temperature", 0},
                    {"logprobs", kTop}};
  httplib::Result res = Post("/v1/completions", req.dump());
  ASSERT_TRUE(res) << cluster_->Logs();
  ASSERT_EQ(res->status, 200) << res->body;
  const json choice = json::parse(res->body)["choices"][0];
  ASSERT_EQ(choice["text"], text);
  const json& lp = choice["logprobs"];
  ASSERT_EQ(lp["token_logprobs"].size(), expected.size()) << lp.dump();
  std::string joined;
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_EQ(lp["token_logprobs"][i].get<float>(), expected[i].logprob) << "token " << i;
    // The alternatives plus the sampled token (the same one under greedy): kTop entries whose
    // values are the engine's.
    std::vector<float> want, got;
    for (const auto& [id, v] : expected[i].top) want.push_back(v);
    for (const auto& [name, v] : lp["top_logprobs"][i].items()) got.push_back(v.get<float>());
    std::sort(want.begin(), want.end());
    std::sort(got.begin(), got.end());
    EXPECT_EQ(got, want) << "token " << i << ": " << lp["top_logprobs"][i].dump();
    EXPECT_EQ(lp["text_offset"][i].get<size_t>(), joined.size()) << "token " << i;  // ASCII
    joined += lp["tokens"][i].get<std::string>();
  }
  EXPECT_EQ(joined, text);
  // The decode worker (index 1) took the prefill worker's first token and its entry: a missing
  // or malformed entry would have made it prefill locally ("fallback").
  const std::string decode_metrics = cluster_->WorkerMetrics(1);
  EXPECT_GE(Metric(decode_metrics, "pd_worker_prefills_total{where=\"remote\"}"), 1)
      << decode_metrics;
  EXPECT_EQ(Metric(decode_metrics, "pd_worker_prefills_total{where=\"fallback\"}"), 0)
      << decode_metrics;

  // Chat, streamed: one entry per generated token, each naming its token's bytes; under
  // greedy decoding the sampled token is the most likely one.
  const json chat = {
      {"model", "stories260K"},   {"messages", {{{"role", "user"}, {"content", kPrompt}}}},
      {"max_tokens", kMaxTokens}, {"temperature", 0},
      {"logprobs", true},         {"top_logprobs", 2},
      {"stream", true},           {"stream_options", {{"include_usage", true}}}};
  res = Post("/v1/chat/completions", chat.dump());
  ASSERT_TRUE(res && res->status == 200) << (res ? res->body : cluster_->Logs());
  std::string content, from_bytes;
  size_t entries = 0, completion_tokens = 0;
  for (absl::string_view event : absl::StrSplit(res->body, "\n\n", absl::SkipEmpty())) {
    const absl::string_view data = event.substr(6);
    if (data == "[DONE]") continue;
    const json chunk = json::parse(data);
    if (chunk["usage"].is_object()) completion_tokens = chunk["usage"]["completion_tokens"];
    for (const json& c : chunk["choices"]) {
      if (c["delta"].contains("content")) content += c["delta"]["content"].get<std::string>();
      if (c["logprobs"].is_null()) continue;
      for (const json& e : c["logprobs"]["content"]) {
        ++entries;
        for (int b : e["bytes"]) from_bytes += static_cast<char>(b);
        ASSERT_EQ(e["top_logprobs"].size(), 2u) << e.dump();
        EXPECT_EQ(e["top_logprobs"][0]["token"], e["token"]) << e.dump();
        EXPECT_EQ(e["top_logprobs"][0]["logprob"], e["logprob"]) << e.dump();
        EXPECT_LE(e["logprob"].get<double>(), 0.0);
      }
    }
  }
  EXPECT_GT(entries, 0u);
  EXPECT_EQ(entries, completion_tokens);
  EXPECT_EQ(from_bytes, content);
}

TEST_F(OpenAiE2eTest, BadRequestsGetTheirStatusAndErrorObject) {
  struct Case {
    std::string name, path, body, key;
    int status;
    std::string param;  // "" = null
  };
  const std::string ok_prompt = R"("model":"stories260K","prompt":"Hi")";
  const std::vector<Case> cases = {
      {"malformed json", "/v1/completions", "{\"model\": ", kKey, 400, ""},
      {"not an object", "/v1/completions", "[1,2]", kKey, 400, ""},
      {"wrong type", "/v1/completions", "{" + ok_prompt + ",\"max_tokens\":\"9\"}", kKey, 400,
       "max_tokens"},
      {"huge max_tokens", "/v1/completions", "{" + ok_prompt + ",\"max_tokens\":99999999}", kKey,
       400, "max_tokens"},
      {"invalid utf-8", "/v1/completions",
       std::string("{\"model\":\"stories260K\",\"prompt\":\"\xc3\x28\"}"), kKey, 400, ""},
      {"unknown field", "/v1/completions", "{" + ok_prompt + ",\"foo\":1}", kKey, 400, "foo"},
      {"n past the bound", "/v1/chat/completions",
       R"({"model":"stories260K","messages":[{"role":"user","content":"x"}],"n":99})", kKey, 400,
       "n"},
      {"prompt past the context", "/v1/completions",
       R"({"model":"stories260K","prompt":")" + std::string(6000, 'a') + "\"}", kKey, 400, ""},
      {"oversized body", "/v1/completions",
       R"({"model":"stories260K","prompt":")" + std::string(70000, 'a') + "\"}", kKey, 413, ""},
      {"no key", "/v1/completions", "{" + ok_prompt + "}", "", 401, ""},
      {"wrong key", "/v1/completions", "{" + ok_prompt + "}", "sk-wrong-wrong-wrong-wrong", 401,
       ""},
      {"unknown model", "/v1/completions", R"({"model":"gpt-5","prompt":"Hi"})", kKey, 404,
       "model"},
      {"unknown path", "/v1/embeddings", "{}", kKey, 404, ""},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    httplib::Result res = Post(c.path, c.body, c.key);
    ASSERT_TRUE(res) << "no response";
    EXPECT_EQ(res->status, c.status) << res->body;
    const json body = json::parse(res->body, nullptr, false);
    ASSERT_TRUE(body.is_object() && body.contains("error")) << res->body;
    const json& e = body["error"];
    EXPECT_TRUE(e["message"].is_string() && !e["message"].get<std::string>().empty());
    EXPECT_TRUE(e["type"].is_string());
    EXPECT_TRUE(e.contains("code"));
    if (c.param.empty()) {
      EXPECT_TRUE(e.contains("param"));
    } else {
      EXPECT_EQ(e["param"], c.param);
    }
  }
  // The router is still serving.
  httplib::Client http("127.0.0.1", http_port_);
  httplib::Result health = http.Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200);
}

// Request metrics are labelled by route pattern: clients asking for random model ids or paths
// (with a key or without, a NUL included) add no label series, and /metrics stays small.
TEST_F(OpenAiE2eTest, ClientChosenPathsDoNotGrowTheMetrics) {
  httplib::Client http("127.0.0.1", http_port_);
  httplib::Headers auth = {{"Authorization", absl::StrCat("Bearer ", kKey)}};
  const size_t before = cluster_->RouterMetrics().size();
  for (int i = 0; i < 50; ++i) {
    httplib::Result res = http.Get(absl::StrCat("/v1/models/random-", i, "%00x").c_str(), auth);
    ASSERT_TRUE(res);
    EXPECT_EQ(res->status, 404);
    res = http.Get(absl::StrCat("/v1/models/nokey-", i).c_str());
    ASSERT_TRUE(res);
    EXPECT_EQ(res->status, 401);
    res = http.Get(absl::StrCat("/v1/no-such-path-", i).c_str());
    ASSERT_TRUE(res);
    EXPECT_EQ(res->status, 404);
  }
  // httplib counts a request after its response is written, so the last ones may be counted
  // a moment after their client read them.
  const std::string last = R"(pd_router_http_requests_total{path="other",status="404"})";
  std::string m = cluster_->RouterMetrics();
  for (const absl::Time by = absl::Now() + absl::Seconds(5);
       Metric(m, last) < 50 && absl::Now() < by; m = cluster_->RouterMetrics()) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_THAT(m, ::testing::Not(HasSubstr("random-")));
  EXPECT_THAT(m, ::testing::Not(HasSubstr("nokey-")));
  EXPECT_THAT(m, ::testing::Not(HasSubstr("no-such-path")));
  EXPECT_EQ(Metric(m, R"(pd_router_http_requests_total{path="/v1/models/{id}",status="404"})"), 50);
  EXPECT_EQ(Metric(m, R"(pd_router_http_requests_total{path="/v1/models/{id}",status="401"})"), 50);
  EXPECT_EQ(Metric(m, last), 50);
  EXPECT_LT(m.size(), before + 2048) << m;
}

// Hostile bodies, as a careless or malicious client sends them: nesting from 10^2 levels up to
// what the body limit allows in every field (one request of 100,000 nested prompt arrays used to
// crash the router), huge numbers, NaN/Infinity literals, invalid UTF-8 in keys and values,
// truncated bodies and bodies at and over --http_max_body_bytes. Each gets its 400/413 naming
// the problem; the router answers /health after every one and serves a normal request at the end.
TEST_F(OpenAiE2eTest, HostileBodiesAreRefusedAndTheRouterKeepsServing) {
  struct Case {
    std::string name, body;
    int status;
    std::string param;  // "" = none named
  };
  const std::string head = R"({"model":"stories260K",)";
  auto nest = [](size_t levels, const std::string& inner) {
    return std::string(levels, '[') + inner + std::string(levels, ']');
  };
  auto nest_objects = [](size_t levels) {
    std::string s;
    for (size_t i = 0; i < levels; ++i) s += R"({"a":)";
    return s + "1" + std::string(levels, '}');
  };
  std::vector<Case> cases;
  for (size_t levels : {100u, 1000u, 30000u}) {
    const std::string n = absl::StrCat(levels);
    cases.push_back(
        {"prompt " + n, head + R"("prompt":)" + nest(levels, "5") + "}", 400, "prompt"});
    for (const char* field : {"metadata", "stop", "stop_token_ids", "logit_bias", "tools",
                              "response_format", "stream_options", "seed"}) {
      cases.push_back({std::string(field) + " " + n,
                       head + R"("prompt":"Hi",")" + field + "\":" + nest(levels, "1") + "}", 400,
                       field});
    }
    cases.push_back(
        {"objects " + n,
         head + R"("prompt":"Hi","metadata":)" + nest_objects(std::min<size_t>(levels, 5000)) + "}",
         400, "metadata"});
    cases.push_back({"messages " + n,
                     R"({"model":"stories260K","messages":[{"role":"user","content":)" +
                         nest(levels, R"({"type":"text","text":"x"})") + "}]}",
                     400, "messages"});
  }
  const std::vector<Case> more = {
      {"prompt [[[5]]]", head + R"("prompt":[[[5]]]})", 400, "prompt[0][0]"},
      {"nested metadata", head + R"("prompt":"Hi","metadata":{"k":[["v"]]}})", 400, "metadata.k"},
      {"huge number", head + R"("prompt":"Hi","temperature":1e400})", 400, ""},
      {"huge integer", head + R"("prompt":"Hi","max_tokens":)" + std::string(400, '9') + "}", 400,
       ""},
      {"NaN literal", head + R"("prompt":"Hi","temperature":NaN})", 400, ""},
      {"Infinity literal", head + R"("prompt":"Hi","top_p":Infinity})", 400, ""},
      {"invalid utf-8 key", head + "\"prompt\":\"Hi\",\"\xff\xfe\":1}", 400, ""},
      {"invalid utf-8 value", head + "\"prompt\":\"\xc3\x28\xed\xa0\x80\"}", 400, ""},
      {"truncated", head + R"("prompt":"Hi","max_tokens":)", 400, ""},
      {"truncated deep", head + R"("prompt":)" + std::string(5000, '['), 400, "prompt"},
      {"over the body limit", head + R"("prompt":")" + std::string(65536, 'a') + "\"}", 413, ""},
  };
  cases.insert(cases.end(), more.begin(), more.end());
  httplib::Client health_client("127.0.0.1", http_port_);
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    ASSERT_LE(c.body.size(), 65536u + 100) << "case larger than intended";
    httplib::Result res = Post("/v1/completions", c.body);
    ASSERT_TRUE(res) << "no response; router log:\n" << cluster_->Logs();
    EXPECT_EQ(res->status, c.status) << res->body.substr(0, 300);
    const json body = json::parse(res->body, nullptr, false);
    ASSERT_TRUE(body.is_object() && body.contains("error")) << res->body.substr(0, 300);
    if (!c.param.empty()) {
      EXPECT_EQ(body["error"]["param"], c.param) << res->body;
    }
    httplib::Result health = health_client.Get("/health");
    ASSERT_TRUE(health) << "router down after " << c.name << ":\n" << cluster_->Logs();
    ASSERT_EQ(health->status, 200);
  }
  // A body of exactly --http_max_body_bytes is read and answered (the prompt is far past the
  // context: 400 from validation, not 413).
  std::string at_limit = head + R"("prompt":")";
  at_limit += std::string(65536 - at_limit.size() - 2, 'a') + "\"}";
  ASSERT_EQ(at_limit.size(), 65536u);
  httplib::Result res = Post("/v1/completions", at_limit);
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 400) << res->body.substr(0, 300);
  // Duplicate keys: the last one wins (as in Python's json and OpenAI's servers).
  res = Post("/v1/completions",
             head + R"("prompt":"Hi","max_tokens":1,"max_tokens":3,"temperature":0})");
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200) << res->body;
  EXPECT_EQ(json::parse(res->body)["usage"]["completion_tokens"], 3);
  // A normal request is served after all that.
  res = Post("/v1/completions", head + R"("prompt":"Once upon a time","max_tokens":4})");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200) << res->body;
}

// A connection waiting for its first request, or for its next one after a response, sleeps in
// the kernel: 200 of them cost the router next to no CPU (httplib 0.11's own wait woke each one
// every 11 ms; 1,000 took both cores of a CI machine and starved its clients). They stay open
// while idle and the router closes each at --http_idle_timeout.
TEST_F(OpenAiE2eTest, IdleConnectionsCostNoCpuAndCloseAtTheIdleTimeout) {
  constexpr int kIdle = 200;
  std::vector<int> socks;
  absl::Cleanup close_all = [&socks] {
    for (int fd : socks) ::close(fd);
  };
  const std::string health = "GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n";
  const absl::Time first = absl::Now();  // the first connection's idle time starts about here
  for (int i = 0; i < kIdle; ++i) {
    absl::StatusOr<int> connected = pd::testing::ConnectLoopback(http_port_);
    ASSERT_TRUE(connected.ok()) << i << ": " << connected.status();
    const int fd = *connected;
    socks.push_back(fd);
    if (i % 2 == 1) continue;  // this one never sends a request
    ASSERT_EQ(::send(fd, health.data(), health.size(), MSG_NOSIGNAL),
              static_cast<ssize_t>(health.size()));
    std::string rest;
    const std::string reply = ReadResponse(fd, &rest);
    ASSERT_TRUE(absl::StartsWith(reply, "HTTP/1.1 200")) << reply;
  }
  const absl::Time opened = absl::Now();
  auto connections = [&] {
    return Metric(cluster_->RouterMetrics(), "pd_router_http_connections", -1);
  };
  // All accepted (the metrics scrape is not on the HTTP API's port).
  while (connections() < kIdle && absl::Now() < opened + absl::Seconds(5)) {
    absl::SleepFor(absl::Milliseconds(50));
  }
  ASSERT_EQ(connections(), kIdle);
  const double cpu_before = Metric(cluster_->RouterMetrics(), "pd_process_cpu_seconds_total");
  absl::SleepFor(absl::Seconds(2));
  const double cpu = Metric(cluster_->RouterMetrics(), "pd_process_cpu_seconds_total") - cpu_before;
  std::cout << "router CPU over 2 s with " << kIdle << " idle connections: " << cpu << " s\n";
  EXPECT_LT(cpu, 0.3);
  if (absl::Now() < first + kIdleTimeout - absl::Seconds(1)) {
    EXPECT_EQ(connections(), kIdle) << "closed before the idle timeout";
  }
  // Each connection ends with the router's FIN once it has been idle for kIdleTimeout.
  for (size_t i = 0; i < socks.size(); ++i) {
    pollfd p = {socks[i], POLLIN, 0};
    const int left_ms = static_cast<int>(std::max<int64_t>(
        0, absl::ToInt64Milliseconds(opened + kIdleTimeout + absl::Seconds(10) - absl::Now())));
    ASSERT_EQ(::poll(&p, 1, left_ms), 1) << "connection " << i << " still open";
    char byte;
    EXPECT_EQ(::recv(socks[i], &byte, 1, 0), 0) << "connection " << i;
  }
  EXPECT_GE(absl::Now() - opened, kIdleTimeout - absl::Seconds(1));
  // The router counts a connection out just after its FIN: allow it a moment on a busy machine.
  const absl::Time closed_by = absl::Now() + absl::Seconds(3);
  while (connections() != 0 && absl::Now() < closed_by) absl::SleepFor(absl::Milliseconds(20));
  EXPECT_EQ(connections(), 0);
}

// Requests pipelined in one write are each answered, in order, on the one connection (the
// router's connection reader keeps what it read past the first request), and a request whose
// head arrives a few bytes at a time is answered too.
TEST_F(OpenAiE2eTest, PipelinedAndTrickledRequestsAreAnswered) {
  absl::StatusOr<int> connected = pd::testing::ConnectLoopback(http_port_);
  ASSERT_TRUE(connected.ok()) << connected.status();
  const int fd = *connected;
  absl::Cleanup close_fd = [fd] { ::close(fd); };
  const std::string models = absl::StrCat("GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\n",
                                          "Authorization: Bearer ", kKey, "\r\n\r\n");
  const std::string three = models + "GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n" +
                            "GET /v1/nothing HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n";
  ASSERT_EQ(::send(fd, three.data(), three.size(), MSG_NOSIGNAL),
            static_cast<ssize_t>(three.size()));
  std::string rest;
  const std::string first = ReadResponse(fd, &rest);
  EXPECT_TRUE(absl::StartsWith(first, "HTTP/1.1 200")) << first;
  EXPECT_THAT(first, HasSubstr("stories260K"));
  const std::string second = ReadResponse(fd, &rest);
  EXPECT_TRUE(absl::StartsWith(second, "HTTP/1.1 200")) << second;
  const std::string third = ReadResponse(fd, &rest);
  EXPECT_TRUE(absl::StartsWith(third, "HTTP/1.1 404")) << third;
  // The same connection, the next request sent 7 bytes at a time.
  for (size_t at = 0; at < models.size(); at += 7) {
    const std::string piece = models.substr(at, 7);
    ASSERT_EQ(::send(fd, piece.data(), piece.size(), MSG_NOSIGNAL),
              static_cast<ssize_t>(piece.size()));
    absl::SleepFor(absl::Milliseconds(5));
  }
  const std::string trickled = ReadResponse(fd, &rest);
  EXPECT_TRUE(absl::StartsWith(trickled, "HTTP/1.1 200")) << trickled;
  EXPECT_THAT(trickled, HasSubstr("stories260K"));
}

TEST_F(OpenAiE2eTest, OfficialNodeSdk) {
  const std::string dir = PD_SOURCE_DIR "/tests/e2e/openai";
  std::ifstream installed(dir + "/node_modules/openai/package.json");
  ASSERT_TRUE(installed.good())
      << "the openai npm package is missing: scripts/setup.sh installs it (npm ci in " << dir
      << ")";
  Reference ref;
  const std::string expected = ref.Greedy(kPrompt, kMaxTokens).second;
  absl::StatusOr<Subprocess> node = Subprocess::Spawn(
      {"/usr/bin/env", absl::StrCat("PD_OPENAI_BASE=http://127.0.0.1:", http_port_, "/v1"),
       absl::StrCat("PD_OPENAI_KEY=", kKey), "PD_OPENAI_MODEL=stories260K",
       absl::StrCat("PD_PROMPT=", kPrompt), absl::StrCat("PD_MAX_TOKENS=", kMaxTokens),
       "PD_EXPECTED=" + expected, "node", dir + "/sdk_check.mjs"},
      Path("node.log"));
  ASSERT_TRUE(node.ok()) << node.status();
  absl::StatusOr<pd::testing::ExitInfo> exit = node->Wait(absl::Seconds(120));
  const std::string log = node->ReadLog();
  ASSERT_TRUE(exit.ok() && exit->Success()) << log << cluster_->Logs();
  for (const char* check :
       {"ok models.list", "ok completions", "ok completions.stream", "ok chat", "ok chat.stream",
        "ok completions.n", "ok chat.stream.n", "ok error.unknown_model", "ok error.n",
        "ok error.api_key", "ok disconnect"}) {
    EXPECT_THAT(log, HasSubstr(check));
  }
  // The aborted stream was cancelled on the decode worker and its blocks returned: nothing
  // runs and no block stays in use (worker 1 is the decode worker).
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  std::string m;
  while (absl::Now() < deadline) {
    m = cluster_->WorkerMetrics(1);
    if (Metric(m, "pd_worker_requests_running") == 0 &&
        Metric(m, "pd_worker_kv_blocks{state=\"used\"}", -1) == 0 &&
        Metric(m, "pd_worker_requests_total{rpc=\"Decode.Generate\",code=\"CANCELLED\"}") >= 1) {
      break;
    }
    absl::SleepFor(absl::Milliseconds(100));
  }
  EXPECT_GE(Metric(m, "pd_worker_requests_total{rpc=\"Decode.Generate\",code=\"CANCELLED\"}"), 1)
      << m;
  EXPECT_EQ(Metric(m, "pd_worker_requests_running"), 0) << m;
  EXPECT_EQ(Metric(m, "pd_worker_kv_blocks{state=\"used\"}", -1), 0) << m;
}

}  // namespace
}  // namespace pd
