// Reasoning blocks (reasoning_parser.h): the split of an output into reasoning and content, the
// same whatever pieces it comes in; and ResponseBuilder's reasoning_content, streamed and whole,
// with tool calls after the block.
#include "services/router/openai/reasoning_parser.h"

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "services/router/openai/openai_request.h"
#include "services/router/openai/openai_response.h"

namespace pd::router::openai {
namespace {

using json = nlohmann::json;
namespace v1 = pdserve::v1;

struct Split {
  std::string reasoning;
  std::string content;
  bool in_block = false;
  bool operator==(const Split&) const = default;
};

// `text` fed in pieces of `piece` bytes (0: whole).
Split Parse(const std::string& text, bool starts_open, size_t piece) {
  ReasoningParser p(starts_open);
  Split s;
  auto take = [&](const std::vector<ReasoningEvent>& events) {
    for (const ReasoningEvent& e : events) {
      (e.kind == ReasoningEvent::Kind::kReasoning ? s.reasoning : s.content) += e.text;
    }
  };
  if (piece == 0) piece = text.size() + 1;
  for (size_t i = 0; i < text.size(); i += piece) take(p.Feed(text.substr(i, piece)));
  take(p.Finish());
  s.in_block = p.in_block();
  return s;
}

TEST(ReasoningParserTest, SplitsBlocksTheSameWhateverThePieces) {
  struct Case {
    std::string text;
    bool starts_open;
    Split want;
  };
  const std::vector<Case> cases = {
      {"<think>\nLet me see.\n</think>\n\nIt is 4.", false,
       {"\nLet me see.\n", "It is 4.", true}},
      {"  <think>a<b</think>c", false, {"a<b", "c", true}},
      {"No thinking here.", false, {"", "No thinking here.", false}},
      {"<thinking>is not the tag", false, {"", "<thinking>is not the tag", false}},
      {"<thi", false, {"", "<thi", false}},  // ended inside what might have been the tag
      {"\n\n", false, {"", "\n\n", false}},
      {"<think>never ends </thi", false, {"never ends </thi", "", true}},
      {"<think></think>", false, {"", "", true}},
      // The prompt opened the block (DeepSeek-R1, Qwen3-Thinking): no start tag in the output.
      {"step 1, step 2</think>\n\nDone.", true, {"step 1, step 2", "Done.", true}},
      {"</think>answer </think> stays", true, {"", "answer </think> stays", true}},
      {"text after <think> is content", false, {"", "text after <think> is content", false}},
  };
  for (const Case& c : cases) {
    const Split whole = Parse(c.text, c.starts_open, 0);
    EXPECT_EQ(whole, c.want) << c.text << ": reasoning \"" << whole.reasoning << "\" content \""
                             << whole.content << "\"";
    for (size_t piece = 1; piece <= 9; ++piece) {
      EXPECT_EQ(Parse(c.text, c.starts_open, piece), whole) << c.text << ", pieces of " << piece;
    }
  }
}

TEST(ReasoningParserTest, TemplatesAndPrompts) {
  EXPECT_TRUE(TemplateHasThinkBlocks("{{- '<think>\\n\\n</think>\\n\\n' }}"));
  EXPECT_FALSE(TemplateHasThinkBlocks("{{ bos_token }}{% for m in messages %}"));
  EXPECT_TRUE(PromptOpensThinkBlock("<|im_start|>assistant\n<think>\n"));
  EXPECT_FALSE(PromptOpensThinkBlock("<|im_start|>assistant\n<think>\n\n</think>\n\n"));
  EXPECT_FALSE(PromptOpensThinkBlock("<|im_start|>assistant\n"));
  EXPECT_FALSE(PromptOpensThinkBlock(""));
}

OpenAiRequest Chat(const std::string& fields, bool stream) {
  absl::StatusOr<OpenAiRequest> r = ParseRequest(
      Endpoint::kChat,
      absl::StrCat(R"({"model":"m","messages":[{"role":"user","content":"x"}])", fields,
                   R"(,"stream":)", stream ? "true" : "false", "}"),
      ParseLimits{});
  EXPECT_TRUE(r.ok()) << r.status();
  return *r;
}

v1::GenerateResponse Msg(const std::string& text, bool last = false) {
  v1::GenerateResponse m;
  m.set_text(text);
  m.add_token_ids(1);
  if (last) m.set_finish_reason(v1::FINISH_REASON_STOP);
  return m;
}

const std::vector<std::string> kPieces = {"<thi", "nk>\nI should call", " the tool.</th",
                                          "ink>\n\n<tool_call>\n{\"name\": \"get_time\", ",
                                          "\"arguments\": {}}\n</tool_call>"};

TEST(ReasoningResponseTest, ReasoningContentWholeAndStreamed) {
  const std::string tools =
      R"(,"tools":[{"type":"function","function":{"name":"get_time"}}])";
  // Whole: reasoning_content, then the call parsed from the content.
  ResponseBuilder whole(Chat(tools, false), "chatcmpl-1", 0, "m", "", nullptr,
                        ToolCallFormat::kHermes, /*reasoning=*/false);
  for (size_t i = 0; i < kPieces.size(); ++i) whole.Add(Msg(kPieces[i], i + 1 == kPieces.size()));
  const json body = json::parse(whole.Body());
  const json& message = body["choices"][0]["message"];
  EXPECT_EQ(message["reasoning_content"], "\nI should call the tool.") << body.dump();
  EXPECT_TRUE(message["content"].is_null()) << body.dump();
  ASSERT_EQ(message["tool_calls"].size(), 1u) << body.dump();
  EXPECT_EQ(message["tool_calls"][0]["function"]["name"], "get_time");
  EXPECT_EQ(body["choices"][0]["finish_reason"], "tool_calls");

  // Streamed: delta.reasoning_content pieces, then the call.
  ResponseBuilder streamed(Chat(tools, true), "chatcmpl-1", 0, "m", "", nullptr,
                           ToolCallFormat::kHermes, /*reasoning=*/false);
  std::string reasoning;
  int calls = 0;
  for (size_t i = 0; i < kPieces.size(); ++i) {
    const std::string sse = streamed.StreamEvents(Msg(kPieces[i], i + 1 == kPieces.size()));
    for (absl::string_view e : absl::StrSplit(sse, "\n\n", absl::SkipEmpty())) {
      const json chunk = json::parse(e.substr(6));
      const json& delta = chunk["choices"][0]["delta"];
      if (delta.contains("reasoning_content")) reasoning += delta["reasoning_content"];
      if (delta.contains("tool_calls")) ++calls;
      if (delta.contains("content")) {
        EXPECT_EQ(delta["content"], "") << e;  // (the role chunk)
      }
    }
  }
  EXPECT_EQ(reasoning, "\nI should call the tool.");
  EXPECT_GE(calls, 1);

  // Not parsed (the template writes no blocks): all content, no reasoning_content field.
  ResponseBuilder off(Chat("", false), "chatcmpl-1", 0, "m", "");
  off.Add(Msg("<think>x</think>y", true));
  const json plain = json::parse(off.Body());
  EXPECT_EQ(plain["choices"][0]["message"]["content"], "<think>x</think>y");
  EXPECT_FALSE(plain["choices"][0]["message"].contains("reasoning_content"));

  // Parsed, no block in the output: content, reasoning_content null.
  ResponseBuilder none(Chat("", false), "chatcmpl-1", 0, "m", "", nullptr,
                       ToolCallFormat::kHermes, false);
  none.Add(Msg("Just an answer.", true));
  const json answer = json::parse(none.Body());
  EXPECT_EQ(answer["choices"][0]["message"]["content"], "Just an answer.");
  EXPECT_TRUE(answer["choices"][0]["message"]["reasoning_content"].is_null());

  // Under a response format the block comes first (pd-router's grammar allows it) and the
  // constrained answer is the content.
  ResponseBuilder constrained(Chat(R"(,"response_format":{"type":"json_object"})", false),
                              "chatcmpl-1", 0, "m", "", nullptr, ToolCallFormat::kHermes, true);
  constrained.Add(Msg("I will answer in JSON.</think>\n\n{}", true));
  const json c = json::parse(constrained.Body());
  EXPECT_EQ(c["choices"][0]["message"]["content"], "{}");
  EXPECT_EQ(c["choices"][0]["message"]["reasoning_content"], "I will answer in JSON.");
}

TEST(ReasoningRequestTest, ChatTemplateKwargs) {
  absl::StatusOr<OpenAiRequest> r = ParseRequest(
      Endpoint::kChat,
      R"({"model":"m","messages":[{"role":"user","content":"x"}],)"
      R"("chat_template_kwargs":{"enable_thinking":false}})",
      ParseLimits{});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(json::parse(r->chat_template_kwargs), json({{"enable_thinking", false}}));
  for (const char* bad : {R"("chat_template_kwargs":true)",
                          R"("chat_template_kwargs":{"messages":[]})",
                          R"("chat_template_kwargs":{"tools":[]})"}) {
    r = ParseRequest(Endpoint::kChat,
                     absl::StrCat(R"({"model":"m","messages":[{"role":"user","content":"x"}],)",
                                  bad, "}"),
                     ParseLimits{});
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_EQ(ParamOf(r.status()), "chat_template_kwargs") << bad;
  }
}

}  // namespace
}  // namespace pd::router::openai
