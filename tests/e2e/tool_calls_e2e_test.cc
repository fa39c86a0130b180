// Tool calling through the cluster (docs/structured-outputs.md, "Tools"): tool_choice "required"
// and a named function on stories260K, through the official openai npm SDK, LangChain's
// ChatOpenAI (withStructuredOutput, bindTools) and Vercel's AI SDK (generateObject, tools),
// streamed and not, parallel_tool_calls (an array of calls), and the legacy functions API
// (function_call) through the openai SDK.
// The enforced constraint makes even a model that has never seen a tool write a valid call:
// every call's arguments validate against its tool's schema (python3-jsonschema). The history
// (an assistant's tool_calls, a tool message) reaches the chat template; bad tool requests are
// 400s naming the field.
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/testing/subprocess.h"
#include "common/testing/temp_dir.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/e2e/cluster_fixture.h"

namespace pd {
namespace {

using ::pd::e2e::Cluster;
using ::testing::HasSubstr;
using json = nlohmann::ordered_json;

using ::pd::e2e::kWeatherSchema;

// A template that shows the offered tools and the history's calls and results (the names only:
// stories260K's context is 512 tokens).
constexpr char kTemplate[] =
    "{% if tools %}TOOLS:{% for t in tools %} {{ t.function.name }}{% endfor %}\n{% endif %}"
    "{% for m in messages %}{{ m['role'] | upper }}: "
    "{% if m.tool_calls %}CALL {{ m.tool_calls[0].function.name }} "
    "{{ m.tool_calls[0].function.arguments.city }}"
    "{% elif m.role == 'tool' %}RESULT {{ m.tool_call_id }} {{ m.content }}"
    "{% else %}{{ m['content'] }}{% endif %}\n{% endfor %}"
    "{% if add_generation_prompt %}ASSISTANT:{% endif %}";

TEST(ToolCallsE2eTest, OpenAiSdkGetsEnforcedCallsThatValidate) {
  const std::string dir = PD_SOURCE_DIR "/tests/e2e/openai";
  std::ifstream installed(dir + "/node_modules/openai/package.json");
  ASSERT_TRUE(installed.good()) << "scripts/setup.sh installs tests/e2e/openai (npm ci)";
  absl::StatusOr<pd::testing::TempDir> tmp = pd::testing::TempDir::Create("pd-tools-sdk-");
  ASSERT_TRUE(tmp.ok()) << tmp.status();
  const std::string chat_template = tmp->path() + "/chat.jinja";
  std::ofstream(chat_template) << kTemplate;
  // Prefill + decode: the constraint crosses the hand-off as structured output's does.
  Cluster cluster(tmp->path(), 1, 1, "round_robin", {},
                  {absl::StrCat("--http_address=127.0.0.1:", e2e::kHttpPort),
                   "--chat_template=" + chat_template});
  ASSERT_TRUE(cluster.WaitReady(absl::Seconds(60))) << cluster.Logs();
  absl::StatusOr<std::string> node = e2e::RunToEnd(
      {"/usr/bin/env", absl::StrCat("PD_OPENAI_BASE=http://127.0.0.1:", cluster.http_port(), "/v1"),
       "PD_OPENAI_MODEL=stories260K", absl::StrCat("PD_SCHEMA=", kWeatherSchema), "node",
       dir + "/tool_calls.mjs"},
      tmp->path() + "/node.log", absl::Seconds(120));
  ASSERT_TRUE(node.ok()) << node.status() << cluster.Logs();
  EXPECT_THAT(*node, HasSubstr(R"("summary":true,"calls":8,"parallel":)")) << *node;
  // parallel_tool_calls: true: one or more calls per answer (two answers), each validated below.
  int parallel = 0;
  for (absl::string_view line : absl::StrSplit(*node, '\n', absl::SkipEmpty())) {
    const json j = json::parse(line, nullptr, false);
    if (j.is_object() && j.contains("summary")) parallel = j.value("parallel", 0);
  }
  EXPECT_GE(parallel, 2) << *node;
  // LangChain's ChatOpenAI: withStructuredOutput (both methods) and bindTools, streamed too.
  absl::StatusOr<std::string> langchain = e2e::RunToEnd(
      {"/usr/bin/env", absl::StrCat("PD_OPENAI_BASE=http://127.0.0.1:", cluster.http_port(), "/v1"),
       "PD_OPENAI_MODEL=stories260K", absl::StrCat("PD_SCHEMA=", kWeatherSchema), "node",
       dir + "/langchain.mjs"},
      tmp->path() + "/langchain.log", absl::Seconds(120));
  ASSERT_TRUE(langchain.ok()) << langchain.status() << cluster.Logs();
  EXPECT_THAT(*langchain, HasSubstr(R"("summary":true,"langchain":6)")) << *langchain;
  // Vercel's AI SDK: text, generateObject and a forced tool, generated and streamed.
  absl::StatusOr<std::string> ai_sdk = e2e::RunToEnd(
      {"/usr/bin/env", absl::StrCat("PD_OPENAI_BASE=http://127.0.0.1:", cluster.http_port(), "/v1"),
       "PD_OPENAI_MODEL=stories260K", absl::StrCat("PD_SCHEMA=", kWeatherSchema), "node",
       dir + "/ai_sdk.mjs"},
      tmp->path() + "/ai_sdk.log", absl::Seconds(120));
  ASSERT_TRUE(ai_sdk.ok()) << ai_sdk.status() << cluster.Logs();
  EXPECT_THAT(*ai_sdk, HasSubstr(R"("summary":true,"ai_sdk":3)")) << *ai_sdk;
  const std::string log = *node + *langchain + *ai_sdk;

  // Each call's arguments against its tool's schema.
  json checks = json::array();
  for (absl::string_view line : absl::StrSplit(log, '\n', absl::SkipEmpty())) {
    const json j = json::parse(line, nullptr, false);
    if (!j.is_object() || !j.contains("how")) continue;
    const json schema = j["name"] == "get_weather"
                            ? json::parse(kWeatherSchema)
                            : json({{"type", "object"}, {"additionalProperties", false}});
    checks.push_back({{"name", j["how"]}, {"schema", schema}, {"arguments", j["arguments"]}});
  }
  ASSERT_EQ(checks.size(), 17u + static_cast<size_t>(parallel)) << log;
  const std::string checks_path = tmp->path() + "/checks.json";
  std::ofstream(checks_path) << checks.dump();
  const std::string script =
      "import json, sys, jsonschema\n"
      "checks = json.load(open(sys.argv[1]))\n"
      "for c in checks:\n"
      "    jsonschema.validate(c['arguments'], c['schema'])\n"
      "print('validated', len(checks))\n";
  absl::StatusOr<std::string> checked = e2e::RunToEnd(
      {"/usr/bin/python3", "-c", script, checks_path}, tmp->path() + "/py.log", absl::Seconds(60));
  ASSERT_TRUE(checked.ok()) << checked.status() << log;
  std::cout << log << *checked;

  // Bad tool requests are 400s naming the field.
  struct Case {
    std::string fields;
    std::string param;
  };
  const std::string tool = R"({"type":"function","function":{"name":"get_time"}})";
  const std::vector<Case> cases = {
      {R"("tools":[{"type":"browser"}])", "tools[0].type"},
      {absl::StrCat(R"("tools":[)", tool, ",", tool, "]"), "tools[1].function.name"},
      {R"("tool_choice":"required")", "tool_choice"},
      {absl::StrCat(R"("tools":[)", tool,
                    R"(],"tool_choice":{"type":"function","function":{"name":"nope"}})"),
       "tool_choice.function.name"},
      {absl::StrCat(R"("tools":[)", tool,
                    R"(],"tool_choice":"required","response_format":{"type":"json_object"})"),
       "tool_choice"},
      {R"("tools":[{"type":"function","function":{"name":"bad name"}}])", "tools[0].function.name"},
  };
  httplib::Client http("127.0.0.1", cluster.http_port());
  http.set_read_timeout(30, 0);
  for (const Case& c : cases) {
    auto res = http.Post("/v1/chat/completions",
                         absl::StrCat(R"({"model":"stories260K","messages":[{"role":"user",)"
                                      R"("content":"x"}],)",
                                      c.fields, "}"),
                         "application/json");
    ASSERT_TRUE(res) << c.fields;
    EXPECT_EQ(res->status, 400) << c.fields << " " << res->body;
    const json err = json::parse(res->body, nullptr, false);
    ASSERT_TRUE(err.is_object()) << res->body;
    EXPECT_EQ(err["error"]["param"], c.param) << res->body;
  }
}

}  // namespace
}  // namespace pd
