// Logit bias, penalties and min_p through a real cluster (issue #31 section 3): the same
// requests, over the OpenAI HTTP API and gRPC, on a prefill + decode cluster (the prefill worker
// samples the first token) and on a decode worker alone give the same tokens; frequency_penalty 2
// changes greedy output; logit_bias -100 on the greedy first token changes it and +100 on a
// chosen token forces it; out-of-range values are refused naming the field. stories260K.
#include <httplib.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/testing/temp_dir.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/e2e/cluster_fixture.h"

namespace pd {
namespace {

using ::pd::e2e::Cluster;
using ::testing::HasSubstr;
using json = nlohmann::json;

constexpr char kPrompt[] = "Once upon a time";
// A chat template for stories260K (llama2.c models carry none), as openai_e2e_test's.
constexpr char kTemplate[] =
    "{% for m in messages %}{{ m['role'] | upper }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}ASSISTANT:{% endif %}";
constexpr uint32_t kChosen = 400;  // the token +100 forces

// What one cluster answered to the fixed set of requests below.
struct Answers {
  std::vector<uint32_t> greedy;        // gRPC, no options
  std::vector<uint32_t> frequency;     // gRPC, frequency_penalty 2
  std::string frequency_http;          // the same over HTTP /v1/completions
  std::vector<uint32_t> banned;        // gRPC, logit_bias -100 on greedy[0]
  bool banned_moved_kv = false;        // its KV came from a prefill worker
  std::vector<uint32_t> forced;        // gRPC, logit_bias +100 on kChosen
  std::string mixed_http_completions;  // HTTP: sampled, every option at once
  std::string mixed_http_chat;         // the same on /v1/chat/completions (message)
  std::vector<uint32_t> mixed_grpc;    // the same over gRPC
  std::string mixed_grpc_text;
  json bad_bias;          // HTTP error object: a logit_bias id past the vocabulary
  json bad_penalty;       // HTTP error object: presence_penalty 3
  grpc::Status bad_grpc;  // gRPC: repetition_penalty -1
};

pdserve::v1::GenerateRequest Request(uint32_t max_tokens) {
  pdserve::v1::GenerateRequest r;
  r.set_text(kPrompt);
  r.mutable_sampling()->set_max_tokens(max_tokens);
  return r;
}

// POST `body` to `path`; the parsed answer (status in "_status").
json Post(int port, const std::string& path, const json& body) {
  httplib::Client http("127.0.0.1", port);
  http.set_read_timeout(60, 0);
  auto res = http.Post(path, body.dump(), "application/json");
  if (!res) return {{"_status", 0}};
  json r = json::parse(res->body, nullptr, false);
  if (!r.is_object()) r = json::object();
  r["_status"] = res->status;
  return r;
}

Answers RunCluster(const std::string& dir, int prefill) {
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/chat.jinja") << kTemplate;
  Cluster cluster(dir, prefill, 1, "round_robin", {},
                  {absl::StrCat("--http_address=127.0.0.1:", e2e::kHttpPort),
                   "--chat_template=" + dir + "/chat.jinja"});
  Answers a;
  if (!cluster.WaitReady(absl::Seconds(60))) {
    ADD_FAILURE() << cluster.Logs();
    return a;
  }
  auto tokens = [&](const pdserve::v1::GenerateRequest& r) {
    e2e::Generated g = cluster.Generate(r);
    EXPECT_TRUE(g.status.ok()) << g.status.error_message() << cluster.Logs();
    return g.tokens;
  };
  a.greedy = tokens(Request(40));
  pdserve::v1::GenerateRequest r = Request(40);
  r.mutable_sampling()->set_frequency_penalty(2.0f);
  a.frequency = tokens(r);
  const json f = Post(cluster.http_port(), "/v1/completions",
                      {{"model", "stories260K"},
                       {"prompt", kPrompt},
                       {"max_tokens", 40},
                       {"temperature", 0},
                       {"frequency_penalty", 2}});
  EXPECT_EQ(f["_status"], 200) << f.dump();
  if (f["_status"] == 200) a.frequency_http = f["choices"][0]["text"];
  if (!a.greedy.empty()) {
    r = Request(8);
    (*r.mutable_sampling()->mutable_logit_bias())[a.greedy[0]] = -100.0f;
    e2e::Generated g = cluster.Generate(r);
    EXPECT_TRUE(g.status.ok()) << g.status.error_message();
    a.banned = g.tokens;
    a.banned_moved_kv = g.last.timings().kv_transfer_us() > 0;
  }
  r = Request(8);
  (*r.mutable_sampling()->mutable_logit_bias())[kChosen] = 100.0f;
  a.forced = tokens(r);

  // Every option at once, sampled: the prefill worker's first token needs the prompt's
  // repetition penalty and the bias; the rest needs the counts.
  json mixed = {{"model", "stories260K"},
                {"max_tokens", 32},
                {"temperature", 0.9},
                {"seed", 7},
                {"presence_penalty", 0.5},
                {"frequency_penalty", 0.7},
                {"repetition_penalty", 1.3},
                {"min_p", 0.05},
                {"top_k", 40},
                {"logit_bias", {{"13", 4}, {"2", -100}}}};
  json c = mixed;
  c["prompt"] = kPrompt;
  const json mc = Post(cluster.http_port(), "/v1/completions", c);
  EXPECT_EQ(mc["_status"], 200) << mc.dump();
  if (mc["_status"] == 200) a.mixed_http_completions = mc["choices"][0]["text"];
  r = Request(32);
  pdserve::v1::SamplingParams* s = r.mutable_sampling();
  s->set_temperature(0.9f);
  s->set_seed(7);
  s->set_presence_penalty(0.5f);
  s->set_frequency_penalty(0.7f);
  s->set_repetition_penalty(1.3f);
  s->set_min_p(0.05f);
  s->set_top_k(40);
  (*s->mutable_logit_bias())[13] = 4.0f;
  (*s->mutable_logit_bias())[2] = -100.0f;
  {
    e2e::Generated g = cluster.Generate(r);
    EXPECT_TRUE(g.status.ok()) << g.status.error_message();
    a.mixed_grpc = g.tokens;
    a.mixed_grpc_text = g.text;
  }
  json ch = mixed;
  ch["messages"] = {{{"role", "user"}, {"content", kPrompt}}};
  const json mch = Post(cluster.http_port(), "/v1/chat/completions", ch);
  EXPECT_EQ(mch["_status"], 200) << mch.dump();
  if (mch["_status"] == 200) a.mixed_http_chat = mch["choices"][0]["message"]["content"];

  json bad = {{"model", "stories260K"}, {"prompt", kPrompt}, {"logit_bias", {{"99999", 1}}}};
  a.bad_bias = Post(cluster.http_port(), "/v1/completions", bad);
  bad = {{"model", "stories260K"}, {"prompt", kPrompt}, {"presence_penalty", 3}};
  a.bad_penalty = Post(cluster.http_port(), "/v1/completions", bad);
  r = Request(4);
  r.mutable_sampling()->set_repetition_penalty(-1.0f);
  a.bad_grpc = cluster.Generate(r).status;
  return a;
}

TEST(PenaltiesE2eTest, SameOnBothPathsAndEachOptionActs) {
  absl::StatusOr<pd::testing::TempDir> tmp = pd::testing::TempDir::Create("pd-penalties-");
  ASSERT_TRUE(tmp.ok()) << tmp.status();
  const Answers pd = RunCluster(tmp->path() + "/pd", 1);
  const Answers local = RunCluster(tmp->path() + "/local", 0);

  ASSERT_EQ(pd.greedy.size(), 40u);
  EXPECT_EQ(pd.greedy, local.greedy);
  // frequency_penalty 2 changes greedy output, the same on both paths and both APIs.
  ASSERT_EQ(pd.frequency.size(), 40u);
  EXPECT_NE(pd.frequency, pd.greedy);
  EXPECT_EQ(pd.frequency, local.frequency);
  EXPECT_FALSE(pd.frequency_http.empty());
  EXPECT_EQ(pd.frequency_http, local.frequency_http);
  // -100 on the greedy first token: another first token (sampled by the prefill worker on the
  // disaggregated path).
  ASSERT_FALSE(pd.banned.empty());
  EXPECT_TRUE(pd.banned_moved_kv);  // so the prefill worker sampled banned[0]
  EXPECT_FALSE(local.banned_moved_kv);
  EXPECT_NE(pd.banned[0], pd.greedy[0]);
  EXPECT_EQ(pd.banned, local.banned);
  // +100 on a token: it is generated at every step.
  EXPECT_EQ(pd.forced, std::vector<uint32_t>(8, kChosen));
  EXPECT_EQ(pd.forced, local.forced);
  // Every option at once, sampled with a seed: identical over HTTP on both paths, and over gRPC.
  EXPECT_FALSE(pd.mixed_http_completions.empty());
  EXPECT_EQ(pd.mixed_http_completions, local.mixed_http_completions);
  ASSERT_EQ(pd.mixed_grpc.size(), 32u);
  EXPECT_EQ(pd.mixed_grpc, local.mixed_grpc);
  EXPECT_EQ(pd.mixed_grpc_text, pd.mixed_http_completions);  // both APIs, the same request
  EXPECT_FALSE(pd.mixed_http_chat.empty());
  EXPECT_EQ(pd.mixed_http_chat, local.mixed_http_chat);
  // Refusals name the field.
  EXPECT_EQ(pd.bad_bias["_status"], 400) << pd.bad_bias.dump();
  EXPECT_EQ(pd.bad_bias["error"]["param"], "logit_bias") << pd.bad_bias.dump();
  EXPECT_THAT(pd.bad_bias["error"]["message"].get<std::string>(), HasSubstr("\"99999\""));
  EXPECT_EQ(pd.bad_penalty["_status"], 400) << pd.bad_penalty.dump();
  EXPECT_EQ(pd.bad_penalty["error"]["param"], "presence_penalty");
  EXPECT_EQ(pd.bad_grpc.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(pd.bad_grpc.error_message(), HasSubstr("sampling.repetition_penalty"));
}

}  // namespace
}  // namespace pd
