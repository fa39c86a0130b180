// ResponseBuilder with tools (openai_response.h): message.tool_calls and delta.tool_calls in
// OpenAI's shapes, for enforced and "auto" choices.
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "services/router/openai/openai_request.h"
#include "services/router/openai/openai_response.h"

namespace pd::router::openai {
namespace {

using json = nlohmann::json;
namespace v1 = pdserve::v1;

constexpr char kTools[] =
    R"("tools":[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object",)"
    R"("properties":{"city":{"type":"string"}},"required":["city"]}}},)"
    R"({"type":"function","function":{"name":"get_time"}}])";

OpenAiRequest Request(const std::string& fields, bool stream) {
  absl::StatusOr<OpenAiRequest> r =
      ParseRequest(Endpoint::kChat,
                   absl::StrCat(R"({"model":"m","messages":[{"role":"user","content":"x"}],)",
                                kTools, fields.empty() ? "" : ",", fields, R"(,"stream":)",
                                stream ? "true" : "false", "}"),
                   ParseLimits{});
  EXPECT_TRUE(r.ok()) << r.status();
  return *r;
}

v1::GenerateResponse Msg(const std::string& text, v1::FinishReason finish = {}) {
  v1::GenerateResponse m;
  m.set_text(text);
  m.add_token_ids(1);
  if (finish != v1::FINISH_REASON_UNSPECIFIED) {
    m.set_finish_reason(finish);
    m.mutable_usage()->set_prompt_tokens(5);
    m.mutable_usage()->set_completion_tokens(3);
  }
  return m;
}

std::vector<json> Chunks(const std::string& sse) {
  std::vector<json> out;
  for (absl::string_view e : absl::StrSplit(sse, "\n\n", absl::SkipEmpty())) {
    EXPECT_TRUE(absl::StartsWith(e, "data: ")) << e;
    out.push_back(json::parse(e.substr(6)));
  }
  return out;
}

// The body of a non-streamed response to `pieces`.
json Body(const OpenAiRequest& r, const std::vector<std::string>& pieces,
          ToolCallFormat format = ToolCallFormat::kHermes,
          v1::FinishReason finish = v1::FINISH_REASON_STOP) {
  ResponseBuilder b(r, "chatcmpl-1", 1, "m", "", nullptr, format);
  for (const std::string& p : pieces) b.Add(Msg(p));
  b.Add(Msg("", finish));
  return json::parse(b.Body());
}

// Every chunk of a stream relaying `pieces`.
std::vector<json> Stream(const OpenAiRequest& r, const std::vector<std::string>& pieces,
                         ToolCallFormat format = ToolCallFormat::kHermes) {
  ResponseBuilder b(r, "chatcmpl-1", 1, "m", "", nullptr, format);
  std::string sse;
  for (const std::string& p : pieces) sse += b.StreamEvents(Msg(p));
  sse += b.StreamEvents(Msg("", v1::FINISH_REASON_STOP));
  return Chunks(sse);
}

TEST(ToolResponseTest, EnforcedCallIsMessageToolCalls) {
  const OpenAiRequest r = Request(R"("tool_choice":"required")", false);
  const json body = Body(r, {R"({"name": "get_weather", "argu)", R"(ments": {"city": "Oslo"}})"});
  const json& choice = body["choices"][0];
  EXPECT_EQ(choice["finish_reason"], "tool_calls");
  EXPECT_TRUE(choice["message"]["content"].is_null());
  ASSERT_EQ(choice["message"]["tool_calls"].size(), 1u);
  const json& call = choice["message"]["tool_calls"][0];
  EXPECT_TRUE(absl::StartsWith(call["id"].get<std::string>(), "call_"));
  EXPECT_EQ(call["type"], "function");
  EXPECT_EQ(call["function"]["name"], "get_weather");
  EXPECT_EQ(json::parse(call["function"]["arguments"].get<std::string>()),
            json({{"city", "Oslo"}}));
}

TEST(ToolResponseTest, EnforcedCallStreamsAsOpenAiDoes) {
  const OpenAiRequest r =
      Request(R"("tool_choice":{"type":"function","function":{"name":"get_time"}})", true);
  const std::vector<json> chunks =
      Stream(r, {R"({"name":"get_)", R"(time","arguments":{)", R"("tz":"U)", R"(TC"}})"});
  // role chunk, call start, argument pieces, finish.
  ASSERT_GE(chunks.size(), 4u);
  EXPECT_EQ(chunks[0]["choices"][0]["delta"]["role"], "assistant");
  const json& start = chunks[1]["choices"][0]["delta"]["tool_calls"][0];
  EXPECT_EQ(start["index"], 0);
  EXPECT_TRUE(absl::StartsWith(start["id"].get<std::string>(), "call_"));
  EXPECT_EQ(start["type"], "function");
  EXPECT_EQ(start["function"]["name"], "get_time");
  EXPECT_EQ(start["function"]["arguments"], "");
  std::string arguments;
  for (size_t i = 2; i + 1 < chunks.size(); ++i) {
    const json& call = chunks[i]["choices"][0]["delta"]["tool_calls"][0];
    EXPECT_EQ(call["index"], 0);
    EXPECT_FALSE(call.contains("id"));
    EXPECT_FALSE(call["function"].contains("name"));
    arguments += call["function"]["arguments"].get<std::string>();
  }
  EXPECT_EQ(arguments, R"({"tz":"UTC"})");
  EXPECT_EQ(chunks.back()["choices"][0]["finish_reason"], "tool_calls");
  EXPECT_EQ(chunks.back()["choices"][0]["delta"], json::object());
}

TEST(ToolResponseTest, AutoParsesTheFamilyFormat) {
  const OpenAiRequest r = Request("", false);
  json body =
      Body(r, {"Sure. <tool_", "call>{\"name\": \"get_time\", \"arguments\": {}}</tool_call>"});
  EXPECT_EQ(body["choices"][0]["message"]["content"], "Sure. ");
  EXPECT_EQ(body["choices"][0]["message"]["tool_calls"][0]["function"]["name"], "get_time");
  EXPECT_EQ(body["choices"][0]["finish_reason"], "tool_calls");
  body = Body(r, {R"({"name": "get_weather", "parameters": {"city": "Rome"}})"},
              ToolCallFormat::kLlama3);
  EXPECT_EQ(body["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"],
            R"({"city": "Rome"})");  // as generated
  // Plain text: no tool_calls key, finish "stop".
  body = Body(r, {"Just text."});
  EXPECT_EQ(body["choices"][0]["message"]["content"], "Just text.");
  EXPECT_FALSE(body["choices"][0]["message"].contains("tool_calls"));
  EXPECT_EQ(body["choices"][0]["finish_reason"], "stop");
  // Malformed call: content, never a crash.
  body = Body(r, {"<tool_call>{\"name\": oops</tool_call>"});
  EXPECT_EQ(body["choices"][0]["message"]["content"], "<tool_call>{\"name\": oops</tool_call>");
  EXPECT_EQ(body["choices"][0]["finish_reason"], "stop");
  // max_tokens cut a call short: "length", the text as content.
  body =
      Body(r, {"<tool_call>{\"name\": \"get_"}, ToolCallFormat::kHermes, v1::FINISH_REASON_LENGTH);
  EXPECT_EQ(body["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(body["choices"][0]["message"]["content"], "<tool_call>{\"name\": \"get_");
}

TEST(ToolResponseTest, AutoStreamHoldsMarkersAndStreamsCalls) {
  const OpenAiRequest r = Request(R"("tool_choice":"auto")", true);
  // The marker arrives split across messages (as across tokens).
  const std::vector<std::string> pieces = {
      "Hi", " <to", "ol_c", "all>{\"name\": \"get_weather\",", " \"arguments\": {\"city\": ",
      "\"Oslo\"}}</tool_call>", "\n<tool_call>{\"name\": \"get_time\", \"arguments\": {}}",
      "</tool_call>"};
  const std::vector<json> chunks = Stream(r, pieces);
  std::string content;
  std::vector<json> calls;
  std::vector<std::string> arguments;
  for (const json& c : chunks) {
    const json& delta = c["choices"][0]["delta"];
    if (delta.contains("content")) {
      content += delta["content"].get<std::string>();
      EXPECT_FALSE(absl::StrContains(delta["content"].get<std::string>(), "<")) << delta;
    }
    if (!delta.contains("tool_calls")) continue;
    const json& call = delta["tool_calls"][0];
    const size_t index = call["index"].get<size_t>();
    if (call.contains("id")) {
      // A call's first delta: id and name, before its arguments were complete.
      EXPECT_EQ(index, calls.size());
      EXPECT_TRUE(arguments.size() == index) << c;
      calls.push_back(call);
      arguments.emplace_back();
    } else {
      EXPECT_FALSE(call["function"].contains("name")) << c;
    }
    ASSERT_LT(index, arguments.size());
    if (call["function"].contains("arguments")) {
      arguments[index] += call["function"]["arguments"].get<std::string>();
    }
  }
  EXPECT_EQ(content, "Hi ");
  ASSERT_EQ(calls.size(), 2u);
  EXPECT_EQ(calls[0]["function"]["name"], "get_weather");
  EXPECT_EQ(calls[1]["function"]["name"], "get_time");
  EXPECT_EQ(arguments, (std::vector<std::string>{R"({"city": "Oslo"})", "{}"}));
  EXPECT_NE(calls[0]["id"], calls[1]["id"]);
  EXPECT_EQ(chunks.back()["choices"][0]["finish_reason"], "tool_calls");
  // The first call started with the piece that named its arguments, before "Oslo" came: more
  // than one chunk carries its arguments.
  int first_call_chunks = 0;
  for (const json& c : chunks) {
    const json& delta = c["choices"][0]["delta"];
    if (delta.contains("tool_calls") && delta["tool_calls"][0]["index"] == 0) ++first_call_chunks;
  }
  EXPECT_GE(first_call_chunks, 2);
}

// The legacy functions API: the call is message.function_call / delta.function_call (no id, no
// index), finish_reason "function_call"; a second call is not expressible and is left out.
TEST(ToolResponseTest, LegacyFunctionsAnswerWithFunctionCall) {
  auto legacy = [](const std::string& fields, bool stream) {
    absl::StatusOr<OpenAiRequest> r = ParseRequest(
        Endpoint::kChat,
        absl::StrCat(R"({"model":"m","messages":[{"role":"user","content":"x"}],)",
                     R"("functions":[{"name":"get_weather","parameters":{"type":"object",)",
                     R"("properties":{"city":{"type":"string"}},"required":["city"]}},)",
                     R"({"name":"get_time"}])",
                     fields, R"(,"stream":)", stream ? "true" : "false", "}"),
        ParseLimits{});
    EXPECT_TRUE(r.ok()) << r.status();
    return *r;
  };
  json body = Body(legacy(R"(,"function_call":{"name":"get_weather"})", false),
                   {R"({"name": "get_weather", "arguments": {"city": "Oslo"}})"});
  const json& choice = body["choices"][0];
  EXPECT_EQ(choice["finish_reason"], "function_call");
  EXPECT_TRUE(choice["message"]["content"].is_null());
  EXPECT_FALSE(choice["message"].contains("tool_calls"));
  EXPECT_EQ(choice["message"]["function_call"]["name"], "get_weather");
  EXPECT_EQ(json::parse(choice["message"]["function_call"]["arguments"].get<std::string>()),
            json({{"city", "Oslo"}}));

  // "auto" with two calls: the first is the answer.
  body = Body(legacy("", false),
              {"<tool_call>{\"name\": \"get_time\", \"arguments\": {}}</tool_call>\n"
               "<tool_call>{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\"}}"
               "</tool_call>"});
  EXPECT_EQ(body["choices"][0]["message"]["function_call"]["name"], "get_time");
  EXPECT_EQ(body["choices"][0]["finish_reason"], "function_call");
  body = Body(legacy("", false), {"Just text."});
  EXPECT_EQ(body["choices"][0]["message"]["content"], "Just text.");
  EXPECT_FALSE(body["choices"][0]["message"].contains("function_call"));
  EXPECT_EQ(body["choices"][0]["finish_reason"], "stop");

  const std::vector<json> chunks =
      Stream(legacy(R"(,"function_call":{"name":"get_time"})", true),
             {R"({"name":"get_)", R"(time","arguments":{)", R"("tz":"U)", R"(TC"}})"});
  ASSERT_GE(chunks.size(), 4u);
  const json& start = chunks[1]["choices"][0]["delta"];
  EXPECT_FALSE(start.contains("tool_calls"));
  EXPECT_EQ(start["function_call"], json({{"name", "get_time"}, {"arguments", ""}}));
  std::string arguments;
  for (size_t i = 2; i + 1 < chunks.size(); ++i) {
    const json& fc = chunks[i]["choices"][0]["delta"]["function_call"];
    EXPECT_FALSE(fc.contains("name"));
    arguments += fc["arguments"].get<std::string>();
  }
  EXPECT_EQ(arguments, R"({"tz":"UTC"})");
  EXPECT_EQ(chunks.back()["choices"][0]["finish_reason"], "function_call");
}

TEST(ToolResponseTest, NothingIsParsedWithoutToolsOrWithNone) {
  OpenAiRequest r = Request(R"("tool_choice":"none")", false);
  json body = Body(r, {"<tool_call>{\"name\": \"get_time\", \"arguments\": {}}</tool_call>"});
  EXPECT_FALSE(body["choices"][0]["message"].contains("tool_calls"));
  EXPECT_EQ(body["choices"][0]["finish_reason"], "stop");
  // "auto" under a response format: the format decides the output.
  r = Request(R"("response_format":{"type":"json_object"})", false);
  body = Body(r, {R"({"name": "get_time", "parameters": {}})"}, ToolCallFormat::kLlama3);
  EXPECT_FALSE(body["choices"][0]["message"].contains("tool_calls"));
}

}  // namespace
}  // namespace pd::router::openai
