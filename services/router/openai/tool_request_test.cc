#include "services/router/openai/tool_request.h"

#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "engine/grammar/constraint.h"
#include "engine/grammar/grammar.h"
#include "engine/grammar/matcher.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "services/router/openai/openai_request.h"

namespace pd::router::openai {
namespace {

using ::testing::HasSubstr;
using json = nlohmann::json;

constexpr char kWeather[] =
    R"({"type":"function","function":{"name":"get_weather","description":"d","strict":true,)"
    R"("parameters":{"type":"object","properties":{"city":{"type":"string"},)"
    R"("unit":{"enum":["c","f"]}},"required":["city","unit"],"additionalProperties":false}}})";
constexpr char kTime[] = R"({"type":"function","function":{"name":"get_time"}})";

absl::StatusOr<OpenAiRequest> Chat(const std::string& extra) {
  return ParseRequest(
      Endpoint::kChat,
      absl::StrCat(R"({"model":"m","messages":[{"role":"user","content":"x"}])", extra, "}"),
      ParseLimits{});
}

void ExpectBad(const absl::StatusOr<OpenAiRequest>& r, const std::string& param,
               const std::string& text) {
  ASSERT_FALSE(r.ok()) << "expected an error naming " << param;
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
  EXPECT_EQ(ParamOf(r.status()), param) << r.status();
  EXPECT_THAT(r.status().message(), HasSubstr(text));
}

TEST(ToolRequestTest, ToolsDefaultToAutoAndKeepTheirText) {
  absl::StatusOr<OpenAiRequest> r = Chat(absl::StrCat(R"(,"tools":[)", kWeather, ",", kTime, "]"));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->tools.choice, ToolChoice::kAuto);
  ASSERT_EQ(r->tools.functions.size(), 2u);
  EXPECT_EQ(r->tools.functions[0].name, "get_weather");
  // Key order kept: the arguments' keys are generated in this order.
  EXPECT_THAT(r->tools.functions[0].parameters, HasSubstr(R"({"city":{"type":"string"},"unit")"));
  EXPECT_EQ(r->tools.functions[1].parameters, "");
  EXPECT_EQ(json::parse(r->tools.tools_json).size(), 2u);
  EXPECT_TRUE(r->tools.offered());
  EXPECT_FALSE(r->tools.enforced());
  EXPECT_FALSE(r->sampling.has_constraint());  // auto: parsed, not enforced
  EXPECT_TRUE(r->tools.parallel_tool_calls);

  r = Chat(absl::StrCat(R"(,"tools":[)", kWeather,
                        R"(],"tool_choice":"none","parallel_tool_calls":false)"));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(r->tools.offered());
  EXPECT_FALSE(r->tools.parallel_tool_calls);
  // No tools at all: nothing offered, and the no-op values of the fields are accepted.
  r = Chat(R"(,"tools":[],"tool_choice":"none","functions":[],"function_call":"none")");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(r->tools.offered());
}

// The tag enforcing a call the model starts under "auto": per offered function, the opening
// its format's template teaches, the function's parameters, the closing; the trigger is the
// format's first marker. DeepSeek-V3 fences the arguments in ```json, V3.1 does not. Mistral's
// markers are special tokens, which the tag names.
TEST(ToolRequestTest, AutoCallTagsFollowTheFormatsTemplates) {
  absl::StatusOr<OpenAiRequest> r = Chat(absl::StrCat(R"(,"tools":[)", kWeather, ",", kTime, "]"));
  ASSERT_TRUE(r.ok()) << r.status();
  const json hermes = json::parse(AutoCallTag(r->tools));
  EXPECT_EQ(hermes["triggers"], json::array({"<tool_call>"}));
  ASSERT_EQ(hermes["structures"].size(), 2u);
  EXPECT_EQ(hermes["structures"][0]["begin"], "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": ");
  EXPECT_EQ(hermes["structures"][0]["end"], "}\n</tool_call>");
  EXPECT_EQ(hermes["structures"][0]["schema"]["required"], json::array({"city", "unit"}));

  const json v3 = json::parse(AutoCallTag(r->tools, ToolCallFormat::kDeepseek));
  EXPECT_EQ(v3["triggers"], json::array({"<｜tool▁calls▁begin｜>"}));
  EXPECT_EQ(v3["structures"][1]["begin"],
            "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_time\n```json\n");
  EXPECT_EQ(v3["structures"][1]["end"], "\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>");
  // A function without parameters takes an empty object.
  EXPECT_EQ(v3["structures"][1]["schema"]["additionalProperties"], false);

  CallTagVariant v31_variant;
  v31_variant.fenced = false;
  const json v31 = json::parse(AutoCallTag(r->tools, ToolCallFormat::kDeepseek, v31_variant));
  EXPECT_EQ(v31["structures"][0]["begin"],
            "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>");
  EXPECT_EQ(v31["structures"][0]["end"], "<｜tool▁call▁end｜><｜tool▁calls▁end｜>");

  // Llama 3: the call is the whole output, so `{` starts one only at the start.
  const json llama = json::parse(AutoCallTag(r->tools, ToolCallFormat::kLlama3));
  EXPECT_EQ(llama["triggers"], json::array({"{"}));
  EXPECT_EQ(llama["at_start"], true);
  EXPECT_EQ(llama["structures"][0]["begin"], "{\"name\": \"get_weather\", \"parameters\": ");
  EXPECT_EQ(llama["structures"][0]["end"], "}");

  // Mistral v3: `[TOOL_CALLS]` (a special token) and a list of calls are the whole output.
  const std::string mistral = AutoCallTag(r->tools, ToolCallFormat::kMistral);
  const json list = json::parse(mistral);
  EXPECT_EQ(list["triggers"], json::array({"[TOOL_CALLS]"}));
  EXPECT_EQ(list["special_tokens"], json::array({"[TOOL_CALLS]"}));
  EXPECT_EQ(list["at_start"], true);
  ASSERT_EQ(list["structures"].size(), 1u);
  EXPECT_EQ(list["structures"][0]["begin"], "[TOOL_CALLS]");
  EXPECT_EQ(list["structures"][0]["schema"]["type"], "array");
  EXPECT_FALSE(list["structures"][0]["schema"].contains("maxItems"));
  grammar::ConstraintSpec spec;
  spec.kind = grammar::ConstraintSpec::Kind::kStructuralTag;
  spec.text = mistral;
  absl::StatusOr<std::shared_ptr<const grammar::CompiledGrammar>> g =
      grammar::CompileConstraint(spec);
  ASSERT_TRUE(g.ok()) << g.status();
  const std::string calls = grammar::SpecialTokenBytes("[TOOL_CALLS]");
  const std::string weather =
      R"({"name": "get_weather", "arguments": {"city": "Oslo", "unit": "c"}})";
  const std::string time = R"({"name": "get_time", "arguments": {}})";
  EXPECT_TRUE(grammar::Matches(*g, calls + "[" + weather + ", " + time + "]"));
  EXPECT_TRUE(grammar::Matches(*g, "Sunny."));
  EXPECT_FALSE(
      grammar::Matches(*g, calls + "[" + R"({"name": "get_date", "arguments": {}})" + "]"));
  EXPECT_FALSE(grammar::Matches(*g, calls + "[" + time + "] and text"));
  // parallel_tool_calls false: one call.
  absl::StatusOr<OpenAiRequest> one =
      Chat(absl::StrCat(R"(,"parallel_tool_calls":false,"tools":[)", kWeather, ",", kTime, "]"));
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_EQ(json::parse(AutoCallTag(
                one->tools, ToolCallFormat::kMistral))["structures"][0]["schema"]["maxItems"],
            1);

  // Mistral v11+: `[TOOL_CALLS]NAME[ARGS]` and the arguments, anywhere in free text.
  CallTagVariant named;
  named.mistral_named = true;
  const json v11 = json::parse(AutoCallTag(r->tools, ToolCallFormat::kMistral, named));
  EXPECT_EQ(v11["special_tokens"], json::array({"[TOOL_CALLS]", "[ARGS]"}));
  EXPECT_FALSE(v11.contains("at_start"));
  ASSERT_EQ(v11["structures"].size(), 2u);
  EXPECT_EQ(v11["structures"][1]["begin"], "[TOOL_CALLS]get_time[ARGS]");
  // A tokenizer whose markers are text: the tag names no special tokens.
  named.mistral_special = false;
  EXPECT_FALSE(json::parse(AutoCallTag(r->tools, ToolCallFormat::kMistral, named))
                   .contains("special_tokens"));
}

TEST(ToolRequestTest, RequiredAndNamedChoicesBecomeASchemaConstraint) {
  absl::StatusOr<OpenAiRequest> r =
      Chat(absl::StrCat(R"(,"tools":[)", kWeather, R"(],"tool_choice":"required")"));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->tools.enforced());
  const json one = json::parse(r->sampling.constraint().json_schema());
  EXPECT_EQ(one["properties"]["name"]["const"], "get_weather");
  EXPECT_EQ(one["properties"]["arguments"]["required"], json({"city", "unit"}));
  EXPECT_EQ(one["required"], json({"name", "arguments"}));
  EXPECT_EQ(one["additionalProperties"], false);
  // The name comes first: the parser learns the function before its arguments.
  EXPECT_LT(r->sampling.constraint().json_schema().find("\"name\""),
            r->sampling.constraint().json_schema().find("\"arguments\""));

  r = Chat(absl::StrCat(R"(,"tools":[)", kWeather, ",", kTime, R"(],"tool_choice":"required")"));
  ASSERT_TRUE(r.ok()) << r.status();
  const json any = json::parse(r->sampling.constraint().json_schema());
  ASSERT_EQ(any["anyOf"].size(), 2u);
  EXPECT_EQ(any["anyOf"][1]["properties"]["name"]["const"], "get_time");
  // A tool without parameters takes an empty object.
  EXPECT_EQ(any["anyOf"][1]["properties"]["arguments"],
            json({{"type", "object"}, {"additionalProperties", false}}));

  r = Chat(absl::StrCat(R"(,"tools":[)", kWeather, ",", kTime,
                        R"(],"tool_choice":{"type":"function","function":{"name":"get_time"}})"));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->tools.choice, ToolChoice::kFunction);
  EXPECT_EQ(r->tools.CallableNames(), std::vector<std::string>{"get_time"});
  EXPECT_EQ(json::parse(r->sampling.constraint().json_schema())["properties"]["name"]["const"],
            "get_time");

  // parallel_tool_calls: true (sent): an array of one or more such calls. Unset or false: one.
  r = Chat(absl::StrCat(R"(,"tools":[)", kWeather, ",", kTime,
                        R"(],"tool_choice":"required","parallel_tool_calls":true)"));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->tools.enforced_list());
  const json list = json::parse(r->sampling.constraint().json_schema());
  EXPECT_EQ(list["type"], "array");
  EXPECT_EQ(list["minItems"], 1);
  EXPECT_EQ(list["items"]["anyOf"].size(), 2u);
  r = Chat(absl::StrCat(R"(,"tools":[)", kWeather,
                        R"(],"tool_choice":"required","parallel_tool_calls":false)"));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(r->tools.enforced_list());
  EXPECT_NE(json::parse(r->sampling.constraint().json_schema())["type"], "array");
}

TEST(ToolRequestTest, BadShapesNameTheField) {
  const std::string w = kWeather;
  ExpectBad(Chat(R"(,"tools":{})"), "tools", "array");
  ExpectBad(Chat(R"(,"tools":[{"type":"code_interpreter"}])"), "tools[0].type", "code_interpreter");
  ExpectBad(Chat(R"(,"tools":[{"type":"function"}])"), "tools[0].function", "required");
  ExpectBad(Chat(R"(,"tools":[{"type":"function","function":{"name":"a b"}}])"),
            "tools[0].function.name", "^[a-zA-Z0-9_-]{1,64}$");
  ExpectBad(Chat(absl::StrCat(R"(,"tools":[{"type":"function","function":{"name":")",
                              std::string(65, 'a'), R"("}}])")),
            "tools[0].function.name", "{1,64}");
  ExpectBad(Chat(R"(,"tools":[{"type":"function","function":{"description":"x"}}])"),
            "tools[0].function.name", "required");
  ExpectBad(Chat(R"(,"tools":[{"type":"function","function":{"name":"a","parameters":[]}}])"),
            "tools[0].function.parameters", "object");
  ExpectBad(Chat(R"(,"tools":[{"type":"function","function":{"name":"a","extra":1}}])"),
            "tools[0].function.extra", "unrecognized");
  ExpectBad(Chat(absl::StrCat(R"(,"tools":[)", w, ",", w, "]")), "tools[1].function.name",
            "duplicate");
  std::string many = R"(,"tools":[)";
  for (int i = 0; i <= 128; ++i) {
    absl::StrAppend(&many, i ? "," : "", R"({"type":"function","function":{"name":"f)", i,
                    R"("}})");
  }
  ExpectBad(Chat(many + "]"), "tools", "at most 128");
  ExpectBad(Chat(R"(,"tool_choice":"required")"), "tool_choice", "needs tools");
  ExpectBad(Chat(absl::StrCat(R"(,"tools":[)", w, R"(],"tool_choice":"sometimes")")), "tool_choice",
            "sometimes");
  ExpectBad(Chat(absl::StrCat(R"(,"tools":[)", w,
                              R"(],"tool_choice":{"type":"function","function":{"name":"nope"}})")),
            "tool_choice.function.name", "no tool named \"nope\"");
  ExpectBad(Chat(absl::StrCat(R"(,"tools":[)", w, R"(],"tool_choice":{"type":"function"})")),
            "tool_choice.function", "required");
  ExpectBad(Chat(absl::StrCat(R"(,"tools":[)", w, R"(],"parallel_tool_calls":1)")),
            "parallel_tool_calls", "boolean");
  // One constraint per request.
  ExpectBad(
      Chat(absl::StrCat(R"(,"tools":[)", w,
                        R"(],"tool_choice":"required","response_format":{"type":"json_object"})")),
      "tool_choice", "response_format");
  ExpectBad(Chat(absl::StrCat(R"(,"tools":[)", w, R"(],"functions":[{"name":"a"}])")), "tools",
            "legacy");
  // Completions have no tools.
  ExpectBad(ParseRequest(Endpoint::kCompletions,
                         absl::StrCat(R"({"model":"m","prompt":"x","tools":[)", w, "]}"), {}),
            "tools", "chat/completions");
}

TEST(ToolRequestTest, HistoryCarriesToolCallsAndToolResults) {
  absl::StatusOr<OpenAiRequest> r = ParseRequest(Endpoint::kChat, R"({"model":"m","messages":[
      {"role":"user","content":"weather?"},
      {"role":"assistant","content":null,"tool_calls":[{"id":"call_1","type":"function",
        "function":{"name":"get_weather","arguments":"{\"city\":\"Paris\",\"unit\":\"c\"}"}}]},
      {"role":"tool","tool_call_id":"call_1","content":"18C"},
      {"role":"assistant","tool_calls":[{"id":"call_2","type":"function",
        "function":{"name":"x","arguments":"not json"}}]}]})",
                                                 ParseLimits{});
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->messages.size(), 4u);
  EXPECT_TRUE(r->messages[1].content_null);
  const json calls = json::parse(r->messages[1].tool_calls_json);
  // Arguments that are a JSON object reach the template as one (as Hugging Face passes them).
  EXPECT_EQ(calls[0]["function"]["arguments"]["city"], "Paris");
  EXPECT_EQ(calls[0]["id"], "call_1");
  EXPECT_EQ(r->messages[2].role, "tool");
  EXPECT_EQ(r->messages[2].tool_call_id, "call_1");
  EXPECT_EQ(r->messages[2].content, "18C");
  EXPECT_TRUE(r->messages[3].content_null);  // absent content
  EXPECT_EQ(json::parse(r->messages[3].tool_calls_json)[0]["function"]["arguments"], "not json");

  auto bad = [](const std::string& message) {
    return ParseRequest(Endpoint::kChat,
                        absl::StrCat(R"({"model":"m","messages":[)", message, "]}"), {});
  };
  ExpectBad(bad(R"({"role":"user","content":"x","tool_calls":[]})"), "messages[0].tool_calls",
            "only assistant");
  ExpectBad(bad(R"({"role":"assistant","tool_calls":[{"id":"a","function":{"name":"f"}}]})"),
            "messages[0].tool_calls[0].function.arguments", "required");
  ExpectBad(
      bad(R"({"role":"assistant","tool_calls":[{"function":{"name":"f","arguments":"{}"}}]})"),
      "messages[0].tool_calls[0].id", "required");
  ExpectBad(bad(R"({"role":"assistant","tool_calls":{}})"), "messages[0].tool_calls", "array");
  ExpectBad(bad(R"({"role":"tool","tool_call_id":"a"})"), "messages[0].content", "required");
  ExpectBad(bad(R"({"role":"tool","tool_call_id":5,"content":"x"})"), "messages[0].tool_call_id",
            "string");
  ExpectBad(bad(R"({"role":"user","tool_call_id":"a","content":"x"})"), "messages[0].tool_call_id",
            "only tool messages");
  ExpectBad(bad(R"({"role":"function","content":"x"})"), "messages[0].name", "required");
  ExpectBad(bad(R"({"role":"assistant","content":"x","function_call":{"name":"f"}})"),
            "messages[0].function_call", "arguments");
  ExpectBad(bad(R"({"role":"user","content":"x","function_call":{"name":"f","arguments":"{}"}})"),
            "messages[0].function_call", "only assistant");
  ExpectBad(bad(R"({"role":"assistant","function_call":{"name":"f","arguments":"{}"},)"
                R"("tool_calls":[{"id":"a","type":"function","function":{"name":"f",)"
                R"("arguments":"{}"}}]})"),
            "messages[0].tool_calls", "function_call");
}

// The legacy functions API (OpenAI's before tools): `functions` and `function_call` read into
// the same spec, marked legacy (one call, answered as `function_call`); its history messages
// (an assistant's `function_call`, role "function") become tool calls and tool results.
TEST(ToolRequestTest, LegacyFunctionsAreToolsAnsweredTheOldWay) {
  const std::string f =
      R"({"name":"get_weather","description":"d","parameters":{"type":"object",)"
      R"("properties":{"city":{"type":"string"}},"required":["city"]}})";
  absl::StatusOr<OpenAiRequest> r = Chat(absl::StrCat(R"(,"functions":[)", f, "]"));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->tools.legacy);
  EXPECT_EQ(r->tools.choice, ToolChoice::kAuto);
  EXPECT_FALSE(r->tools.parallel_tool_calls);
  ASSERT_EQ(r->tools.functions.size(), 1u);
  EXPECT_EQ(r->tools.functions[0].name, "get_weather");
  // The template sees them as tools.
  const json tools = json::parse(r->tools.tools_json);
  EXPECT_EQ(tools[0]["type"], "function");
  EXPECT_EQ(tools[0]["function"]["name"], "get_weather");

  r = Chat(absl::StrCat(R"(,"functions":[)", f, R"(],"function_call":{"name":"get_weather"})"));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->tools.choice, ToolChoice::kFunction);
  EXPECT_TRUE(r->sampling.has_constraint());  // enforced, as a named tool_choice
  r = Chat(absl::StrCat(R"(,"functions":[)", f, R"(],"function_call":"none")"));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(r->tools.offered());

  ExpectBad(Chat(R"(,"functions":{})"), "functions", "array");
  ExpectBad(Chat(absl::StrCat(R"(,"functions":[)", f, ",", f, "]")), "functions[1].name",
            "duplicate");
  ExpectBad(Chat(R"(,"functions":[{"description":"no name"}])"), "functions[0].name", "required");
  ExpectBad(Chat(R"(,"functions":[{"name":"a","parameters":[]}])"), "functions[0].parameters",
            "JSON Schema");
  ExpectBad(Chat(absl::StrCat(R"(,"functions":[)", f, R"(],"function_call":"required")")),
            "function_call", "\"required\"");
  ExpectBad(Chat(absl::StrCat(R"(,"functions":[)", f, R"(],"function_call":{"name":"nope"})")),
            "function_call.name", "no function named \"nope\"");
  ExpectBad(Chat(R"(,"function_call":"auto")"), "function_call", "needs functions");
  ExpectBad(Chat(absl::StrCat(R"(,"functions":[)", f, R"(],"tool_choice":"auto")")),
            "tool_choice", "legacy");

  r = ParseRequest(Endpoint::kChat, R"({"model":"m","messages":[
      {"role":"user","content":"weather?"},
      {"role":"assistant","content":null,
       "function_call":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"}},
      {"role":"function","name":"get_weather","content":"18C"}]})",
                   ParseLimits{});
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->messages.size(), 3u);
  const json calls = json::parse(r->messages[1].tool_calls_json);
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_EQ(calls[0]["function"]["name"], "get_weather");
  EXPECT_EQ(calls[0]["function"]["arguments"]["city"], "Paris");
  EXPECT_EQ(r->messages[2].role, "tool");
  EXPECT_EQ(r->messages[2].name, "get_weather");
  EXPECT_EQ(r->messages[2].content, "18C");
}

}  // namespace
}  // namespace pd::router::openai
