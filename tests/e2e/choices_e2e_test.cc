// n > 1 through a real cluster (issue #31 section 3): one prefill worker and two decode workers
// placed round-robin, stories260K. A request of n choices is prefilled once: the first choice
// goes through the prefill worker, the others run on its decode worker and compute only the
// prompt's last block again (worker metric pd_worker_prefill_tokens_total, router metric
// pd_router_prefill_placements_total{placement="sibling"}). Greedy choices equal each other and
// the n = 1 answer; seeded sampled choice i equals the n = 1 answer with seed + i, streamed
// (chunks by index, one usage chunk, one [DONE]) or not; the gRPC API's `n` likewise (messages
// tagged with their choice's index).
#include <httplib.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/testing/temp_dir.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/e2e/cluster_fixture.h"

namespace pd {
namespace {

using ::pd::e2e::Cluster;
using ::pd::e2e::Generated;
using ::pd::e2e::Metric;
using json = nlohmann::json;

constexpr char kTemplate[] =
    "{% for m in messages %}{{ m['role'] | upper }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}ASSISTANT:{% endif %}";

// A prompt of several blocks, so that sharing them is visible in the prefill counts.
std::string LongPrompt() {
  std::string p;
  for (int i = 0; i < 6; ++i) {
    p += "Once upon a time there was a little girl named Lily. She liked to play in the park. ";
  }
  return p;
}

// POST `body` to `path`: the parsed answer (status in "_status"), or for a stream the raw body
// in "_raw".
json Post(int port, const std::string& path, const json& body) {
  httplib::Client http("127.0.0.1", port);
  http.set_read_timeout(60, 0);
  auto res = http.Post(path, body.dump(), "application/json");
  if (!res) return {{"_status", 0}};
  json r = json::parse(res->body, nullptr, false);
  if (!r.is_object()) r = {{"_raw", res->body}};
  r["_status"] = res->status;
  return r;
}

double PrefillTokens(Cluster& c) {
  double sum = 0;
  for (size_t i = 0; i < c.workers().size(); ++i) {
    sum += Metric(c.WorkerMetrics(static_cast<int>(i)), "pd_worker_prefill_tokens_total");
  }
  return sum;
}

// A streamed chat response of several choices: each choice's content, finish reasons, the usage
// chunks and the [DONE] events seen.
struct Streamed {
  std::vector<std::string> content;
  std::vector<int> finishes;
  int usage_chunks = 0;
  json usage;
  int done = 0;
};

Streamed ParseStream(const std::string& raw, size_t n) {
  Streamed s;
  s.content.resize(n);
  s.finishes.resize(n);
  for (absl::string_view event : absl::StrSplit(raw, "\n\n", absl::SkipEmpty())) {
    if (!absl::ConsumePrefix(&event, "data: ")) continue;  // pings
    if (event == "[DONE]") {
      ++s.done;
      continue;
    }
    const json j = json::parse(event, nullptr, false);
    EXPECT_TRUE(j.is_object()) << event;
    if (!j.is_object()) continue;
    if (j["choices"].empty()) {
      ++s.usage_chunks;
      s.usage = j["usage"];
      continue;
    }
    const json& c = j["choices"][0];
    const size_t index = c["index"].get<size_t>();
    EXPECT_LT(index, n);
    if (index >= n) continue;
    if (c["delta"].contains("content"))
      s.content[index] += c["delta"]["content"].get<std::string>();
    if (!c["finish_reason"].is_null()) ++s.finishes[index];
  }
  return s;
}

TEST(ChoicesE2eTest, ChoicesShareOnePrefillAndEqualTheirSingleRequests) {
  absl::StatusOr<pd::testing::TempDir> tmp = pd::testing::TempDir::Create("pd-choices-");
  ASSERT_TRUE(tmp.ok()) << tmp.status();
  const std::string dir = tmp->path() + "/cluster";
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/chat.jinja") << kTemplate;
  Cluster cluster(dir, 1, 2, "round_robin", {},
                  {absl::StrCat("--http_address=127.0.0.1:", e2e::kHttpPort),
                   "--chat_template=" + dir + "/chat.jinja"});
  ASSERT_TRUE(cluster.WaitReady(absl::Seconds(60))) << cluster.Logs();
  const int port = cluster.http_port();
  const std::string prompt = LongPrompt();

  // Greedy: n = 1, then n = 4 — the choices equal it, and the prompt is computed once.
  const json single =
      Post(port, "/v1/completions",
           {{"model", "stories260K"}, {"prompt", prompt}, {"max_tokens", 24}, {"temperature", 0}});
  ASSERT_EQ(single["_status"], 200) << single.dump() << cluster.Logs();
  const int64_t prompt_tokens = single["usage"]["prompt_tokens"].get<int64_t>();
  ASSERT_GT(prompt_tokens, 64);
  const double prefill_before = PrefillTokens(cluster);
  const double siblings_before =
      Metric(cluster.RouterMetrics(), "pd_router_prefill_placements_total{placement=\"sibling\"}");
  // A cache salt of its own: the n = 1 request's cached blocks do not serve this one.
  const json four = Post(port, "/v1/completions",
                         {{"model", "stories260K"},
                          {"prompt", prompt},
                          {"max_tokens", 24},
                          {"temperature", 0},
                          {"n", 4},
                          {"cache_salt", "choices"}});
  ASSERT_EQ(four["_status"], 200) << four.dump() << cluster.Logs();
  ASSERT_EQ(four["choices"].size(), 4u) << four.dump();
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(four["choices"][i]["index"], i);
    EXPECT_EQ(four["choices"][i]["text"], single["choices"][0]["text"]) << i;
  }
  EXPECT_EQ(four["usage"]["prompt_tokens"], prompt_tokens);
  EXPECT_EQ(four["usage"]["completion_tokens"].get<int64_t>(),
            4 * single["usage"]["completion_tokens"].get<int64_t>());
  // One prefill: the first choice's prompt, then at most one block (16 tokens) per sibling.
  const double prefilled = PrefillTokens(cluster) - prefill_before;
  EXPECT_GE(prefilled, static_cast<double>(prompt_tokens));
  EXPECT_LE(prefilled, static_cast<double>(prompt_tokens + 3 * 16)) << cluster.Logs();
  EXPECT_EQ(
      Metric(cluster.RouterMetrics(), "pd_router_prefill_placements_total{placement=\"sibling\"}") -
          siblings_before,
      3);

  // Seeded sampling: choice i is the n = 1 answer with seed + i; the choices differ.
  std::vector<std::string> seeded;
  for (int i = 0; i < 3; ++i) {
    const json one = Post(port, "/v1/chat/completions",
                          {{"model", "stories260K"},
                           {"messages", {{{"role", "user"}, {"content", prompt}}}},
                           {"max_tokens", 24},
                           {"temperature", 1.0},
                           {"seed", 100 + i}});
    ASSERT_EQ(one["_status"], 200) << one.dump() << cluster.Logs();
    seeded.push_back(one["choices"][0]["message"]["content"]);
  }
  EXPECT_TRUE(seeded[0] != seeded[1] || seeded[1] != seeded[2]) << "seeds 100..102 all agree";
  const json body = {{"model", "stories260K"},
                     {"messages", {{{"role", "user"}, {"content", prompt}}}},
                     {"max_tokens", 24},
                     {"temperature", 1.0},
                     {"seed", 100},
                     {"n", 3}};
  const json three = Post(port, "/v1/chat/completions", body);
  ASSERT_EQ(three["_status"], 200) << three.dump() << cluster.Logs();
  ASSERT_EQ(three["choices"].size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(three["choices"][i]["message"]["content"], seeded[i]) << i;
  }
  // The same streamed: each choice's chunks under its index, one usage chunk, one [DONE].
  json streamed_body = body;
  streamed_body["stream"] = true;
  streamed_body["stream_options"] = {{"include_usage", true}};
  const json raw = Post(port, "/v1/chat/completions", streamed_body);
  ASSERT_EQ(raw["_status"], 200) << raw.dump() << cluster.Logs();
  const Streamed s = ParseStream(raw["_raw"].get<std::string>(), 3);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(s.content[i], seeded[i]) << i;
    EXPECT_EQ(s.finishes[i], 1) << i;
  }
  EXPECT_EQ(s.usage_chunks, 1);
  EXPECT_EQ(s.usage["completion_tokens"], three["usage"]["completion_tokens"]);
  EXPECT_EQ(s.done, 1);

  // best_of other than n is refused by name; n past the bound too.
  json bad = Post(port, "/v1/completions",
                  {{"model", "stories260K"}, {"prompt", "x"}, {"n", 2}, {"best_of", 3}});
  EXPECT_EQ(bad["_status"], 400);
  EXPECT_EQ(bad["error"]["param"], "best_of");
  bad = Post(port, "/v1/completions", {{"model", "stories260K"}, {"prompt", "x"}, {"n", 99}});
  EXPECT_EQ(bad["_status"], 400);
  EXPECT_EQ(bad["error"]["param"], "n");

  // The gRPC API: the same choices on one stream, each message tagged with its index.
  {
    pdserve::v1::GenerateRequest req;
    req.set_text(prompt);
    req.set_cache_salt("grpc-choices");
    req.mutable_sampling()->set_max_tokens(24);
    const Generated one = cluster.Generate(req);
    ASSERT_TRUE(one.status.ok()) << one.status.error_message() << cluster.Logs();
    const double siblings0 = Metric(cluster.RouterMetrics(),
                                    "pd_router_prefill_placements_total{placement=\"sibling\"}");
    int bad_index = 0;
    const std::vector<Generated> greedy =
        cluster.GenerateChoices(req, 4, absl::Seconds(60), &bad_index);
    EXPECT_EQ(bad_index, 0);
    ASSERT_TRUE(greedy[0].status.ok()) << greedy[0].status.error_message() << cluster.Logs();
    for (size_t i = 0; i < 4; ++i) {
      EXPECT_EQ(greedy[i].tokens, one.tokens) << i;
      EXPECT_EQ(greedy[i].text, one.text) << i;
      EXPECT_NE(greedy[i].last.finish_reason(), pdserve::v1::FINISH_REASON_UNSPECIFIED) << i;
      EXPECT_EQ(greedy[i].last.usage().completion_tokens(), greedy[i].tokens.size()) << i;
      EXPECT_EQ(greedy[i].last.usage().prompt_tokens(), one.last.usage().prompt_tokens()) << i;
    }
    EXPECT_EQ(Metric(cluster.RouterMetrics(),
                     "pd_router_prefill_placements_total{placement=\"sibling\"}") -
                  siblings0,
              3);
    // Seeded sampling: choice i is the n = 1 answer with seed + i.
    req.mutable_sampling()->set_temperature(1.0f);
    std::vector<Generated> singles;
    for (int i = 0; i < 3; ++i) {
      req.mutable_sampling()->set_seed(200 + static_cast<uint64_t>(i));
      singles.push_back(cluster.Generate(req));
      ASSERT_TRUE(singles.back().status.ok()) << singles.back().status.error_message();
    }
    req.mutable_sampling()->set_seed(200);
    const std::vector<Generated> sampled = cluster.GenerateChoices(req, 3);
    ASSERT_TRUE(sampled[0].status.ok()) << sampled[0].status.error_message() << cluster.Logs();
    for (size_t i = 0; i < 3; ++i) EXPECT_EQ(sampled[i].tokens, singles[i].tokens) << i;
    // n past the bound is refused naming the field.
    const std::vector<Generated> bad = cluster.GenerateChoices(req, 17);
    EXPECT_EQ(bad[0].status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_THAT(bad[0].status.error_message(), ::testing::HasSubstr("n: must be in [1, 16]"));
    // A deadline that passes mid-stream ends every choice; nothing is left open (below).
    pdserve::v1::GenerateRequest long_req;
    long_req.set_text(prompt);
    long_req.mutable_sampling()->set_ignore_eos(true);
    long_req.mutable_sampling()->set_max_tokens(400);
    const std::vector<Generated> cut =
        cluster.GenerateChoices(long_req, 3, absl::Milliseconds(40));
    EXPECT_FALSE(cut[0].status.ok());
    // timeout_ms counts from the request for every choice: the call ends DEADLINE_EXCEEDED.
    pdserve::v1::GenerateRequest timed_req;
    timed_req.set_text("Once");  // room for 500 tokens: far more than 20 ms of decoding
    timed_req.mutable_sampling()->set_ignore_eos(true);
    timed_req.mutable_sampling()->set_max_tokens(500);
    timed_req.set_timeout_ms(20);
    const std::vector<Generated> timed = cluster.GenerateChoices(timed_req, 3);
    EXPECT_EQ(timed[0].status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED)
        << timed[0].status.error_message() << cluster.Logs();
  }
  // (Metric reads 0 from a router that stopped answering: check that it answers.)
  ASSERT_FALSE(cluster.RouterMetrics().empty()) << "the router stopped answering\n"
                                                << cluster.Logs();
  for (int i = 0; i < 100 && Metric(cluster.RouterMetrics(), "pd_router_inflight_streams") != 0;
       ++i) {
    absl::SleepFor(absl::Milliseconds(50));
  }
  EXPECT_EQ(Metric(cluster.RouterMetrics(), "pd_router_inflight_streams"), 0);
}

}  // namespace
}  // namespace pd
