// Structured output through the cluster (docs/structured-outputs.md): the OpenAI API's
// response_format with real schemas from the shared JSON Schema set, on a prefill + decode
// cluster and on a decode worker that prefills itself. Greedy constrained output is identical on
// both paths (the prefill worker samples the first token under the mask, the decode worker
// replays it into its own matcher); every answer that ends with "stop" validates against its
// schema with Debian's python3-jsonschema; the official openai npm SDK gets JSON, streamed and
// not; bad constraints are 400s naming the problem.
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/testing/subprocess.h"
#include "common/testing/temp_dir.h"
#include "engine/grammar/constraint.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/e2e/cluster_fixture.h"

namespace pd {
namespace {

using ::pd::e2e::Cluster;
using ::testing::HasSubstr;
using json = nlohmann::ordered_json;

constexpr char kSchemaDir[] = PD_SHARED_DIR "/jsonschema";
constexpr char kPersonSchema[] =
    R"({"type":"object","properties":{"name":{"type":"string","maxLength":12},)"
    R"("age":{"type":"integer","minimum":0,"maximum":99},"pet":{"enum":["cat","dog"]}},)"
    R"("required":["name","age","pet"],"additionalProperties":false})";

struct Answer {
  int status = 0;
  std::string finish;
  std::string text;
  std::string error;
};

Answer Complete(int port, const json& schema, const std::string& prompt) {
  json body = {{"model", "stories260K"},
               {"prompt", prompt},
               {"max_tokens", 400},
               {"temperature", 0},
               {"response_format",
                {{"type", "json_schema"}, {"json_schema", {{"name", "s"}, {"schema", schema}}}}}};
  httplib::Client http("127.0.0.1", port);
  http.set_read_timeout(60, 0);
  auto res = http.Post("/v1/completions", body.dump(), "application/json");
  Answer a;
  if (!res) return a;
  a.status = res->status;
  const json r = json::parse(res->body, nullptr, false);
  if (a.status != 200) {
    a.error = res->body;
    return a;
  }
  a.finish = r["choices"][0]["finish_reason"].get<std::string>();
  a.text = r["choices"][0]["text"].get<std::string>();
  return a;
}

// The schemas: ours plus the first of several families of the shared set, in a fixed order.
std::vector<std::pair<std::string, json>> Schemas() {
  std::vector<std::pair<std::string, json>> out = {{"person", json::parse(kPersonSchema)}};
  std::vector<std::string> files;
  for (const auto& e : std::filesystem::directory_iterator(kSchemaDir)) {
    files.push_back(e.path().filename().string());
  }
  std::sort(files.begin(), files.end());
  std::map<std::string, int> taken;
  const std::map<std::string, int> want = {
      {"BFCL_simple", 6}, {"Github_trivial", 3}, {"Glaiveai2K", 3}, {"Handwritten", 2}};
  for (const std::string& f : files) {
    for (const auto& [family, n] : want) {
      if (absl::StartsWith(f, family) && taken[family] < n) {
        std::ifstream in(std::string(kSchemaDir) + "/" + f);
        const json doc = json::parse(in, nullptr, false);
        // Schemas the engine refuses (an unsupported keyword) are the set test's business.
        if (doc.is_object() && doc.contains("schema") &&
            grammar::CompileConstraint(
                {grammar::ConstraintSpec::Kind::kJsonSchema, doc["schema"].dump(), {}})
                .ok()) {
          out.emplace_back(f, doc["schema"]);
          ++taken[family];
        }
      }
    }
  }
  return out;
}

std::vector<Answer> RunAll(const std::string& dir, int prefill,
                           const std::vector<std::pair<std::string, json>>& schemas) {
  Cluster cluster(dir, prefill, 1, "round_robin", {},
                  {absl::StrCat("--http_address=127.0.0.1:", e2e::kHttpPort)});
  EXPECT_TRUE(cluster.WaitReady(absl::Seconds(60))) << cluster.Logs();
  std::vector<Answer> out;
  for (const auto& [name, schema] : schemas) {
    out.push_back(Complete(cluster.http_port(), schema, "Once upon a time"));
  }
  return out;
}

TEST(StructuredOutputE2eTest, SchemasFromTheSharedSetOnBothPathsValidate) {
  absl::StatusOr<pd::testing::TempDir> tmp = pd::testing::TempDir::Create("pd-structured-");
  ASSERT_TRUE(tmp.ok()) << tmp.status();
  const auto schemas = Schemas();
  ASSERT_GE(schemas.size(), 10u) << "the shared JSON Schema set is missing";
  std::filesystem::create_directories(tmp->path() + "/pd");
  std::filesystem::create_directories(tmp->path() + "/local");
  const std::vector<Answer> disagg = RunAll(tmp->path() + "/pd", 1, schemas);
  const std::vector<Answer> local = RunAll(tmp->path() + "/local", 0, schemas);
  ASSERT_EQ(disagg.size(), schemas.size());
  ASSERT_EQ(local.size(), schemas.size());
  json checks = json::array();
  int stopped = 0;
  for (size_t i = 0; i < schemas.size(); ++i) {
    const std::string& name = schemas[i].first;
    ASSERT_EQ(disagg[i].status, 200) << name << ": " << disagg[i].error;
    ASSERT_EQ(local[i].status, 200) << name << ": " << local[i].error;
    EXPECT_EQ(disagg[i].text, local[i].text) << name << ": prefill + decode vs local prefill";
    EXPECT_EQ(disagg[i].finish, local[i].finish) << name;
    if (disagg[i].finish == "stop") {
      ++stopped;
      checks.push_back({{"name", name}, {"schema", schemas[i].second}, {"text", disagg[i].text}});
    } else {
      EXPECT_EQ(disagg[i].finish, "length") << name;
    }
  }
  // stories260K writes stories, not JSON: many strings run to max_tokens. Enough finish.
  EXPECT_GE(stopped, static_cast<int>(schemas.size() / 2)) << "of " << schemas.size();
  const std::string checks_path = tmp->path() + "/checks.json";
  std::ofstream(checks_path) << checks.dump();
  const std::string script =
      "import json, sys, jsonschema\n"
      "bad = 0\n"
      "for c in json.load(open(sys.argv[1])):\n"
      "    try:\n"
      "        jsonschema.validate(json.loads(c['text']), c['schema'])\n"
      "    except Exception as e:\n"
      "        bad += 1\n"
      "        print(c['name'], repr(c['text'])[:200], str(e)[:200])\n"
      "print('validated', len(json.load(open(sys.argv[1]))), 'invalid', bad)\n"
      "sys.exit(1 if bad else 0)\n";
  absl::StatusOr<std::string> checked = e2e::RunToEnd(
      {"/usr/bin/python3", "-c", script, checks_path}, tmp->path() + "/py.log", absl::Seconds(60));
  ASSERT_TRUE(checked.ok()) << checked.status();
  std::cout << *checked;
}

TEST(StructuredOutputE2eTest, OpenAiSdkGetsJsonAndBadConstraintsAre400s) {
  const std::string dir = PD_SOURCE_DIR "/tests/e2e/openai";
  std::ifstream installed(dir + "/node_modules/openai/package.json");
  ASSERT_TRUE(installed.good()) << "scripts/setup.sh installs tests/e2e/openai (npm ci)";
  absl::StatusOr<pd::testing::TempDir> tmp = pd::testing::TempDir::Create("pd-structured-sdk-");
  ASSERT_TRUE(tmp.ok()) << tmp.status();
  const std::string chat_template = tmp->path() + "/chat.jinja";
  std::ofstream(chat_template)
      << "{% for m in messages %}{{ m['role'] | upper }}: {{ m['content'] }}\n{% endfor %}"
         "{% if add_generation_prompt %}ASSISTANT:{% endif %}";
  Cluster cluster(tmp->path(), 1, 1, "round_robin", {},
                  {absl::StrCat("--http_address=127.0.0.1:", e2e::kHttpPort),
                   "--chat_template=" + chat_template});
  ASSERT_TRUE(cluster.WaitReady(absl::Seconds(60))) << cluster.Logs();
  absl::StatusOr<std::string> node = e2e::RunToEnd(
      {"/usr/bin/env", absl::StrCat("PD_OPENAI_BASE=http://127.0.0.1:", cluster.http_port(), "/v1"),
       "PD_OPENAI_MODEL=stories260K", absl::StrCat("PD_SCHEMA=", kPersonSchema), "node",
       dir + "/structured_output.mjs"},
      tmp->path() + "/node.log", absl::Seconds(120));
  ASSERT_TRUE(node.ok()) << node.status() << cluster.Logs();
  const std::string& log = *node;
  EXPECT_THAT(log, HasSubstr(R"("summary":true,"answers":3)")) << log;
  // Every person answer ends (the schema bounds every string and number).
  EXPECT_THAT(log, ::testing::Not(HasSubstr(R"("finish":"length")"))) << log;

  struct Case {
    std::string body;
    std::string message;
  };
  const std::vector<Case> cases = {
      {R"({"model":"stories260K","prompt":"x","guided_json":{"type":"array","uniqueItems":true}})",
       "uniqueItems"},
      {R"({"model":"stories260K","prompt":"x","guided_json":{"type":"integer","minimum":5,"maximum":2}})",
       "matches nothing"},
      {R"({"model":"stories260K","prompt":"x","guided_regex":"(a"})", "missing ')'"},
      {R"({"model":"stories260K","prompt":"x","guided_json":{"$ref":"#/$defs/nope"}})", "$defs"},
      {R"({"model":"stories260K","prompt":"x","guided_grammar":"root ::= e\ne ::= e \"+\" [0-9]"})",
       "rule 'e' is left-recursive"},
      {R"({"model":"stories260K","prompt":"x","guided_grammar":"root ::= \"a\" @"})",
       "line 1, column 14: unexpected '@'"},
      {R"({"model":"stories260K","prompt":"x","response_format":{"type":"json_schema","json_schema":{"name":"n","schema":[1]}}})",
       "must be a JSON Schema"},
      {absl::StrCat(
           R"({"model":"stories260K","prompt":"x","guided_json":{"type":"object","description":")",
           std::string(2 << 20, 'a'), R"("}})"),
       "exceed"},
  };
  httplib::Client http("127.0.0.1", cluster.http_port());
  http.set_read_timeout(30, 0);
  // A GBNF grammar (vLLM's guided_grammar) through prefill and decode workers: the text is a
  // sentence of it.
  {
    const nlohmann::json body = {
        {"model", "stories260K"},
        {"prompt", "Once upon a time"},
        {"max_tokens", 60},
        {"guided_grammar",
         "root ::= \" The \" animal \" was \" [a-z]{2,10} (\" and \" [a-z]{2,10})? \".\"\n"
         "animal ::= \"cat\" | \"dog\" | \"bird\""}};
    auto res = http.Post("/v1/completions", body.dump(), "application/json");
    ASSERT_TRUE(res) << "grammar request";
    ASSERT_EQ(res->status, 200) << res->body;
    const nlohmann::json out = nlohmann::json::parse(res->body);
    const std::string text = out["choices"][0]["text"].get<std::string>();
    EXPECT_EQ(out["choices"][0]["finish_reason"], "stop") << text;
    EXPECT_TRUE(std::regex_match(
        text, std::regex(R"( The (cat|dog|bird) was [a-z]{2,10}( and [a-z]{2,10})?\.)")))
        << text;
  }
  for (const Case& c : cases) {
    auto res = http.Post("/v1/completions", c.body, "application/json");
    ASSERT_TRUE(res) << c.message;
    // The 2 MiB schema is past the router's body limit (413) or the constraint's (400).
    EXPECT_TRUE(res->status == 400 || res->status == 413) << res->status << " " << res->body;
    if (res->status == 400) {
      EXPECT_THAT(res->body, HasSubstr(c.message)) << c.body.substr(0, 200);
    }
  }
  // The router and the worker still serve.
  EXPECT_EQ(cluster.GenerateText("Once upon a time", 4).status.error_code(), grpc::StatusCode::OK);
}

}  // namespace
}  // namespace pd
