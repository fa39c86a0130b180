#include "services/router/openai/tool_parser.h"

#include <set>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace pd::router::openai {
namespace {

using json = nlohmann::json;
using Kind = ToolCallEvent::Kind;
using Mode = ToolCallParser::Mode;

// What a response made of a parser's events: the content, and each call's name and arguments.
struct Result {
  std::string content;
  std::vector<std::string> names;
  std::vector<std::string> arguments;
  std::vector<std::string> ids;
  // The content that was passed on before the end (a stream's early chunks).
  std::string content_before_end;
};

void Take(std::vector<ToolCallEvent> events, Result* r) {
  for (ToolCallEvent& e : events) {
    if (e.kind == Kind::kContent) {
      r->content += e.text;
    } else if (e.kind == Kind::kCallStart) {
      EXPECT_EQ(e.index, static_cast<int>(r->names.size()));
      EXPECT_TRUE(absl::StartsWith(e.id, "call_")) << e.id;
      EXPECT_EQ(e.id.size(), 29u);
      r->names.push_back(e.name);
      r->ids.push_back(e.id);
      r->arguments.emplace_back();
    } else {
      ASSERT_LT(e.index, static_cast<int>(r->arguments.size()));
      r->arguments[e.index] += e.text;
    }
  }
}

// Feeds `pieces` one after the other (as a stream's messages), then ends the output.
Result Parse(Mode mode, ToolCallFormat format, const std::vector<std::string>& pieces,
             std::vector<std::string> names = {"get_weather", "get_time"}, bool list = false) {
  ToolCallParser p(mode, format, std::move(names), list);
  Result r;
  for (const std::string& piece : pieces) Take(p.Feed(piece), &r);
  r.content_before_end = r.content;
  Take(p.Finish(), &r);
  EXPECT_EQ(p.num_calls(), static_cast<int>(r.names.size()));
  return r;
}

// Every split of `text` into two pieces, and one piece per byte, give the same result.
void ExpectSameForEverySplit(Mode mode, ToolCallFormat format, const std::string& text,
                             bool list = false) {
  const std::vector<std::string> names = {"get_weather", "get_time"};
  const Result whole = Parse(mode, format, {text}, names, list);
  std::vector<std::string> bytes;
  for (const char c : text) bytes.emplace_back(1, c);
  const Result each = Parse(mode, format, bytes, names, list);
  EXPECT_EQ(each.content, whole.content);
  EXPECT_EQ(each.names, whole.names);
  EXPECT_EQ(each.arguments, whole.arguments);
  for (size_t i = 0; i <= text.size(); ++i) {
    const Result split = Parse(mode, format, {text.substr(0, i), text.substr(i)}, names, list);
    EXPECT_EQ(split.content, whole.content) << i;
    EXPECT_EQ(split.names, whole.names) << i;
    EXPECT_EQ(split.arguments, whole.arguments) << i;
  }
}

TEST(ToolParserTest, FormatsByNameAndFromTheTemplate) {
  EXPECT_EQ(*ParseToolCallFormat("llama3"), ToolCallFormat::kLlama3);
  EXPECT_EQ(*ParseToolCallFormat("mistral"), ToolCallFormat::kMistral);
  EXPECT_EQ(*ParseToolCallFormat("hermes"), ToolCallFormat::kHermes);
  EXPECT_FALSE(ParseToolCallFormat("qwen").ok());
  EXPECT_EQ(DetectToolCallFormat("{{ '<tool_call>\\n' }}"), ToolCallFormat::kHermes);
  EXPECT_EQ(DetectToolCallFormat("{{- '[TOOL_CALLS] [' }}"), ToolCallFormat::kMistral);
  EXPECT_EQ(DetectToolCallFormat("{{- '<|python_tag|>' }}"), ToolCallFormat::kLlama3);
  EXPECT_EQ(DetectToolCallFormat("<|start_header_id|>ipython<|end_header_id|>"),
            ToolCallFormat::kLlama3);
  EXPECT_EQ(DetectToolCallFormat(""), ToolCallFormat::kHermes);
  EXPECT_NE(NewToolCallId(), NewToolCallId());
}

TEST(ToolParserTest, EnforcedCallStreamsItsArguments) {
  const std::string out =
      R"({ "name" : "get_weather" , "arguments" : {"city": "Pa\"ris}", "n": [1, {"a": 2}]} })";
  ToolCallParser p(Mode::kEnforced, ToolCallFormat::kHermes, {"get_weather"});
  Result r;
  Take(p.Feed(R"({ "name" : "get_wea)"), &r);
  EXPECT_TRUE(r.names.empty());  // the name is not known yet
  Take(p.Feed(R"(ther" , "arguments" : {"ci)"), &r);
  ASSERT_EQ(r.names, std::vector<std::string>{"get_weather"});
  EXPECT_EQ(r.arguments[0], R"({"ci)");  // the arguments stream before they are complete
  Take(p.Feed(out.substr(std::string(R"({ "name" : "get_weather" , "arguments" : {"ci)").size())),
       &r);
  Take(p.Finish(), &r);
  EXPECT_EQ(r.arguments[0], R"({"city": "Pa\"ris}", "n": [1, {"a": 2}]})");
  EXPECT_EQ(r.content, "");
  EXPECT_TRUE(json::parse(r.arguments[0]).is_object());
  ExpectSameForEverySplit(Mode::kEnforced, ToolCallFormat::kHermes, out);
  // A call cut (max_tokens) before its arguments began is content; after, a partial call.
  Result cut = Parse(Mode::kEnforced, ToolCallFormat::kHermes, {R"({"name":"get_we)"});
  EXPECT_EQ(cut.content, R"({"name":"get_we)");
  EXPECT_TRUE(cut.names.empty());
  cut = Parse(Mode::kEnforced, ToolCallFormat::kHermes, {R"({"name":"get_time","arguments":{"a)"});
  EXPECT_EQ(cut.arguments, std::vector<std::string>{R"({"a)"});
}

// parallel_tool_calls: true with an enforced choice: an array of calls, each streamed as its
// name and its arguments come, whatever the split; a list cut after a call keeps that call.
// A call naming a function not offered is no call even when enforced (found by the fuzzer).
TEST(ToolParserTest, EnforcedCallOfAnUnknownFunctionIsContent) {
  const std::string out = R"({"name": "get_weAather", "arguments": {}})";
  const Result r = Parse(Mode::kEnforced, ToolCallFormat::kHermes, {out});
  EXPECT_TRUE(r.names.empty());
  EXPECT_EQ(r.content, out);
}

TEST(ToolParserTest, EnforcedListStreamsEachCall) {
  const std::string out =
      R"( [ {"name": "get_weather", "arguments": {"city": "Oslo, \"N\" ]"}} ,)"
      R"({ "name":"get_time" ,"arguments":{}}, {"name": "get_weather", "arguments": {"a": [1]}} ] )";
  ToolCallParser p(Mode::kEnforced, ToolCallFormat::kHermes, {"get_weather", "get_time"},
                   /*list=*/true);
  Result r;
  Take(p.Feed(R"( [ {"name": "get_weather", "arguments": {"ci)"), &r);
  ASSERT_EQ(r.names, std::vector<std::string>{"get_weather"});
  EXPECT_EQ(r.arguments[0], R"({"ci)");
  Take(p.Feed(out.substr(std::string(R"( [ {"name": "get_weather", "arguments": {"ci)").size())),
       &r);
  Take(p.Finish(), &r);
  EXPECT_EQ(r.names, (std::vector<std::string>{"get_weather", "get_time", "get_weather"}));
  EXPECT_EQ(r.arguments,
            (std::vector<std::string>{R"({"city": "Oslo, \"N\" ]"})", "{}", R"({"a": [1]})"}));
  for (const std::string& a : r.arguments) EXPECT_TRUE(json::parse(a).is_object()) << a;
  EXPECT_EQ(r.content, "");
  EXPECT_EQ(std::set<std::string>(r.ids.begin(), r.ids.end()).size(), 3u);
  ExpectSameForEverySplit(Mode::kEnforced, ToolCallFormat::kHermes, out, /*list=*/true);
  // Cut by max_tokens: inside the second call's head, the first call stands; before any call,
  // the text is content.
  Result cut = Parse(Mode::kEnforced, ToolCallFormat::kHermes,
                     {R"([{"name":"get_time","arguments":{}},{"name":"get_we)"},
                     {"get_weather", "get_time"}, true);
  EXPECT_EQ(cut.names, std::vector<std::string>{"get_time"});
  EXPECT_EQ(cut.content, "");
  cut = Parse(Mode::kEnforced, ToolCallFormat::kHermes, {R"([{"na)"}, {"get_weather", "get_time"},
              true);
  EXPECT_TRUE(cut.names.empty());
  EXPECT_EQ(cut.content, R"({"na)");
}

TEST(ToolParserTest, HermesCallsAfterTextAndBetweenWhitespace) {
  const std::string out =
      "Let me check.<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": "
      "\"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n"
      "</tool_call>";
  const Result r = Parse(Mode::kAuto, ToolCallFormat::kHermes, {out});
  EXPECT_EQ(r.content, "Let me check.");
  EXPECT_EQ(r.names, (std::vector<std::string>{"get_weather", "get_time"}));
  // Streamed as generated.
  EXPECT_EQ(r.arguments, (std::vector<std::string>{R"({"city": "Paris"})", "{}"}));
  EXPECT_NE(r.ids[0], r.ids[1]);
  ExpectSameForEverySplit(Mode::kAuto, ToolCallFormat::kHermes, out);
}

TEST(ToolParserTest, HermesHoldsBackOnlyWhatMayStartAMarker) {
  ToolCallParser p(Mode::kAuto, ToolCallFormat::kHermes, {"get_weather"});
  Result r;
  Take(p.Feed("a < b and <tool"), &r);
  EXPECT_EQ(r.content, "a < b and ");  // "<tool" may be the marker's start: held
  Take(p.Feed("box> is text"), &r);
  EXPECT_EQ(r.content, "a < b and <toolbox> is text");
  Take(p.Feed(" <tool_"), &r);
  Take(p.Feed("call>{\"name\": \"get_weather\", \"argu"), &r);
  EXPECT_TRUE(r.names.empty());  // a call starts once its name and arguments' key are known
  Take(p.Feed("ments\": {\"ci"), &r);
  ASSERT_EQ(r.names.size(), 1u);
  EXPECT_EQ(r.arguments[0], R"({"ci)");  // then its arguments stream
  Take(p.Feed("ty\": \"a </t"), &r);
  EXPECT_EQ(r.arguments[0], R"({"city": "a )");  // "</t" may be </tool_call>: held
  Take(p.Feed("d>\"}}</tool_call>"), &r);
  EXPECT_EQ(r.arguments[0], R"({"city": "a </td>"})");
  Take(p.Finish(), &r);
  EXPECT_EQ(r.content, "a < b and <toolbox> is text ");
}

TEST(ToolParserTest, MalformedCallsAreContent) {
  // An unknown function, arguments that are no object, no call object, a call cut short.
  for (const std::string& out : {
           std::string("<tool_call>{\"name\": \"rm_rf\", \"arguments\": {}}</tool_call>"),
           std::string("<tool_call>{\"name\": \"get_time\", \"arguments\": 5}</tool_call>"),
           std::string("<tool_call>[1, 2]</tool_call>"),
       }) {
    const Result r = Parse(Mode::kAuto, ToolCallFormat::kHermes, {out});
    EXPECT_TRUE(r.names.empty()) << out;
    EXPECT_EQ(r.content, out);
  }
  const Result cut =
      Parse(Mode::kAuto, ToolCallFormat::kHermes, {"hi <tool_call>{\"name\": \"get"});
  EXPECT_TRUE(cut.names.empty());
  EXPECT_EQ(cut.content, "hi <tool_call>{\"name\": \"get");
  // Unterminated but complete (the model ended right after the JSON): still a call.
  const Result open = Parse(Mode::kAuto, ToolCallFormat::kHermes,
                            {"<tool_call>{\"name\": \"get_time\", \"arguments\": {}}"});
  EXPECT_EQ(open.names, std::vector<std::string>{"get_time"});
  // Arguments that break once started are the call's, as generated (as OpenAI's may be), up to
  // the </tool_call> that ends them; what follows is content again.
  const Result broken =
      Parse(Mode::kAuto, ToolCallFormat::kHermes,
            {"<tool_call>{\"name\": \"get_weather\", \"arguments\": {\"a\": </tool_call> ok"});
  EXPECT_EQ(broken.names, std::vector<std::string>{"get_weather"});
  EXPECT_EQ(broken.arguments[0], "{\"a\": ");
  EXPECT_EQ(broken.content, "ok");
  // Other spellings are parsed whole: the keys in another order, arguments as a JSON string.
  const Result reversed =
      Parse(Mode::kAuto, ToolCallFormat::kHermes,
            {"<tool_call>{\"arguments\": {\"b\": 1}, \"name\": \"get_time\"}</tool_call>"});
  EXPECT_EQ(reversed.names, std::vector<std::string>{"get_time"});
  EXPECT_EQ(reversed.arguments[0], R"({"b":1})");
  // A call in the wrong format for the family is plain text.
  const Result other = Parse(Mode::kAuto, ToolCallFormat::kHermes,
                             {"[TOOL_CALLS][{\"name\": \"get_time\", \"arguments\": {}}]"});
  EXPECT_TRUE(other.names.empty());
}

// Output nested deeper than any call (a model can write 100,000 brackets) is never recursed
// through: streamed arguments are scanned, not parsed; what is parsed whole is content.
TEST(ToolParserTest, DeeplyNestedOutputIsContent) {
  const std::string deep_value =
      "{\"a\": " + std::string(100000, '[') + std::string(100000, ']') + "}";
  const std::string deep_args = "{\"name\": \"get_time\", \"arguments\": " + deep_value + "}";
  const Result hermes =
      Parse(Mode::kAuto, ToolCallFormat::kHermes, {"<tool_call>" + deep_args + "</tool_call>"});
  EXPECT_EQ(hermes.names, std::vector<std::string>{"get_time"});
  EXPECT_EQ(hermes.arguments[0], deep_value);
  const Result llama = Parse(Mode::kAuto, ToolCallFormat::kLlama3, {deep_args});
  EXPECT_EQ(llama.names, std::vector<std::string>{"get_time"});
  EXPECT_EQ(llama.arguments[0], deep_value);
  const std::string deep_whole = "{\"arguments\": " + deep_value + ", \"name\": \"get_time\"}";
  const Result reversed = Parse(Mode::kAuto, ToolCallFormat::kLlama3, {deep_whole});
  EXPECT_TRUE(reversed.names.empty());
  EXPECT_EQ(reversed.content, deep_whole);
  const Result mistral = Parse(Mode::kAuto, ToolCallFormat::kMistral, {std::string(100000, '[')});
  EXPECT_TRUE(mistral.names.empty());
  // Arguments written as a JSON string that nests deeply.
  const std::string in_string = "<tool_call>{\"name\": \"get_time\", \"arguments\": \"" +
                                std::string(100000, '[') + "\"}</tool_call>";
  EXPECT_TRUE(Parse(Mode::kAuto, ToolCallFormat::kHermes, {in_string}).names.empty());
  // 64 levels are fine.
  const std::string ok =
      "<tool_call>{\"name\": \"get_time\", \"arguments\": {\"a\": " + std::string(61, '[') +
      std::string(61, ']') + "}}</tool_call>";
  EXPECT_EQ(Parse(Mode::kAuto, ToolCallFormat::kHermes, {ok}).names,
            std::vector<std::string>{"get_time"});
}

TEST(ToolParserTest, Llama3WholeOutputIsTheCall) {
  const std::string out = R"({"name": "get_weather", "parameters": {"city": "Rome"}})";
  Result r = Parse(Mode::kAuto, ToolCallFormat::kLlama3, {out});
  EXPECT_EQ(r.names, std::vector<std::string>{"get_weather"});
  EXPECT_EQ(r.arguments[0], R"({"city": "Rome"})");
  EXPECT_EQ(r.content, "");
  ExpectSameForEverySplit(Mode::kAuto, ToolCallFormat::kLlama3, out);
  // <|python_tag|> decoded as text (a tokenizer that keeps special tokens) is skipped.
  r = Parse(Mode::kAuto, ToolCallFormat::kLlama3, {"<|python", "_tag|>", out});
  EXPECT_EQ(r.names, std::vector<std::string>{"get_weather"});
  // Plain text streams as it comes; JSON that is no call is returned as content at the end.
  ToolCallParser p(Mode::kAuto, ToolCallFormat::kLlama3, {"get_weather"});
  Result text;
  Take(p.Feed("  The "), &text);
  EXPECT_EQ(text.content, "  The ");
  Take(p.Feed("weather is {fine}"), &text);
  EXPECT_EQ(text.content, "  The weather is {fine}");
  r = Parse(Mode::kAuto, ToolCallFormat::kLlama3, {R"({"answer": 42})"});
  EXPECT_TRUE(r.names.empty());
  EXPECT_EQ(r.content_before_end, "");  // held until the end decided
  EXPECT_EQ(r.content, R"({"answer": 42})");
}

TEST(ToolParserTest, MistralCallList) {
  const std::string out =
      R"([TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Lyon"}}, )"
      R"({"name": "get_time", "arguments": {}}])";
  Result r = Parse(Mode::kAuto, ToolCallFormat::kMistral, {out});
  EXPECT_EQ(r.names, (std::vector<std::string>{"get_weather", "get_time"}));
  EXPECT_EQ(r.arguments[0], R"({"city": "Lyon"})");
  ExpectSameForEverySplit(Mode::kAuto, ToolCallFormat::kMistral, out);
  // [TOOL_CALLS] is a control token most tokenizers decode as nothing.
  r = Parse(Mode::kAuto, ToolCallFormat::kMistral,
            {R"([{"name": "get_time", "arguments": "{\"tz\": \"UTC\"}"}])"});
  EXPECT_EQ(r.names, std::vector<std::string>{"get_time"});
  EXPECT_EQ(r.arguments[0], R"({"tz":"UTC"})");
  // Malformed: everything is content, as generated.
  r = Parse(Mode::kAuto, ToolCallFormat::kMistral, {"[TOOL_CALLS] [{\"name\": \"get_time\", "});
  EXPECT_TRUE(r.names.empty());
  EXPECT_EQ(r.content, "[TOOL_CALLS] [{\"name\": \"get_time\", ");
  r = Parse(Mode::kAuto, ToolCallFormat::kMistral, {"[1] is a list"});
  EXPECT_EQ(r.content, "[1] is a list");
  EXPECT_TRUE(r.names.empty());
}

// Mistral's v11+ templates: `[TOOL_CALLS]name[ARGS]{...}` per call, the markers decoded as
// text or as nothing; held until the end, then calls; anything else stays content.
TEST(ToolParserTest, MistralNamedCalls) {
  const std::string out = R"([TOOL_CALLS]get_weather[ARGS]{"city": "Oslo", "days": [1, 2]})"
                          R"([TOOL_CALLS]get_time[ARGS]{})";
  Result r = Parse(Mode::kAuto, ToolCallFormat::kMistral, {out});
  ASSERT_EQ(r.names, (std::vector<std::string>{"get_weather", "get_time"}));
  EXPECT_EQ(nlohmann::json::parse(r.arguments[0]),
            nlohmann::json::parse(R"({"city": "Oslo", "days": [1, 2]})"));
  EXPECT_EQ(r.arguments[1], "{}");
  EXPECT_TRUE(r.content.empty()) << r.content;
  ExpectSameForEverySplit(Mode::kAuto, ToolCallFormat::kMistral, out);
  // The markers decoded as nothing; a brace inside a string.
  r = Parse(Mode::kAuto, ToolCallFormat::kMistral, {R"(get_time{"tz": "}{"})"});
  ASSERT_EQ(r.names, std::vector<std::string>{"get_time"});
  EXPECT_EQ(nlohmann::json::parse(r.arguments[0]), nlohmann::json::parse(R"({"tz": "}{"})"));
  ExpectSameForEverySplit(Mode::kAuto, ToolCallFormat::kMistral, R"(get_time{"tz": "}{"})");
  // Text that only looks like a call's start is content, passed on as soon as it is known.
  r = Parse(Mode::kAuto, ToolCallFormat::kMistral, {"get_weather is sunny today"});
  EXPECT_TRUE(r.names.empty());
  EXPECT_EQ(r.content, "get_weather is sunny today");
  EXPECT_EQ(r.content_before_end, "get_weather is sunny today");
  r = Parse(Mode::kAuto, ToolCallFormat::kMistral, {"get", " a coffee"});
  EXPECT_EQ(r.content, "get a coffee");
  // Unknown functions, cut or malformed arguments: the output as generated.
  for (const std::string& bad : std::vector<std::string>{
           R"(get_wind[ARGS]{"a": 1})", R"(get_weather[ARGS]{"city": )",
           R"(get_weather[ARGS]{"city": "Oslo"} and more)", R"(get_weather[ARGS][1, 2])"}) {
    r = Parse(Mode::kAuto, ToolCallFormat::kMistral, {bad});
    EXPECT_TRUE(r.names.empty()) << bad;
    EXPECT_EQ(r.content, bad);
  }
}

// DeepSeek-V3/R1 (and V3.1's shorter form): text, then the calls block, held until it closes;
// text after it is content again; a block that does not parse is content as generated.
TEST(ToolParserTest, DeepseekCallsBlock) {
  const std::string out =
      "Checking.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n"
      "```json\n{\"city\": \"Oslo\"}\n```<｜tool▁call▁end｜>\n"
      "<｜tool▁call▁begin｜>function<｜tool▁sep｜>get_time\n```json\n{}\n```<｜tool▁call▁end｜>"
      "<｜tool▁calls▁end｜>";
  Result r = Parse(Mode::kAuto, ToolCallFormat::kDeepseek, {out});
  ASSERT_EQ(r.names, (std::vector<std::string>{"get_weather", "get_time"}));
  EXPECT_EQ(nlohmann::json::parse(r.arguments[0]), nlohmann::json::parse(R"({"city": "Oslo"})"));
  EXPECT_EQ(r.arguments[1], "{}");
  EXPECT_EQ(r.content, "Checking.");
  ExpectSameForEverySplit(Mode::kAuto, ToolCallFormat::kDeepseek, out);
  // Content before the block streams as it comes; a marker's start is held back until known.
  ToolCallParser p(Mode::kAuto, ToolCallFormat::kDeepseek, {"get_weather"});
  Result streamed;
  Take(p.Feed("Let me look <｜tool"), &streamed);
  EXPECT_EQ(streamed.content, "Let me look ");
  // V3.1's form; the output cut before the block closes still gives the complete calls.
  r = Parse(Mode::kAuto, ToolCallFormat::kDeepseek,
            {"<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_time<｜tool▁sep｜>{\"tz\": \"UTC\"}"
             "<｜tool▁call▁end｜>"});
  ASSERT_EQ(r.names, std::vector<std::string>{"get_time"});
  EXPECT_EQ(nlohmann::json::parse(r.arguments[0]), nlohmann::json::parse(R"({"tz": "UTC"})"));
  // Unknown functions and broken arguments: the whole block is content, as generated.
  for (const std::string& bad :
       {std::string("<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_wind\n"
                    "```json\n{}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>"),
        std::string("<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_time\n"
                    "```json\n{\"tz\": \n```<｜tool▁call▁end｜><｜tool▁calls▁end｜> after")}) {
    r = Parse(Mode::kAuto, ToolCallFormat::kDeepseek, {bad});
    EXPECT_TRUE(r.names.empty()) << bad;
    EXPECT_EQ(r.content, bad);
  }
  EXPECT_EQ(DetectToolCallFormat("{{'<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>'}}"),
            ToolCallFormat::kDeepseek);
  EXPECT_EQ(*ParseToolCallFormat("deepseek"), ToolCallFormat::kDeepseek);
}

// Llama 3 and Mistral calls stream as Hermes calls do: the call once its name is known, its
// arguments as they come, each call of a list in turn.
TEST(ToolParserTest, WholeOutputCallsStreamPieceByPiece) {
  ToolCallParser p(Mode::kAuto, ToolCallFormat::kMistral, {"get_weather", "get_time"});
  Result r;
  Take(p.Feed("[TOOL"), &r);
  Take(p.Feed("_CALLS] [{\"name\": \"get_weather\", \"arguments\": {\"city\""), &r);
  ASSERT_EQ(r.names, std::vector<std::string>{"get_weather"});
  EXPECT_EQ(r.arguments[0], R"({"city")");
  Take(p.Feed(": \"Lyon\", \"days\": [1, {\"x\": \"]}\"}]}, \"id\": {\"k\": 1}},"), &r);
  EXPECT_EQ(r.arguments[0], R"({"city": "Lyon", "days": [1, {"x": "]}"}]})");
  Take(p.Feed(" {\"name\": \"get_time\", \"parameters\": {"), &r);
  ASSERT_EQ(r.names, (std::vector<std::string>{"get_weather", "get_time"}));
  Take(p.Feed("}}]  Done."), &r);
  EXPECT_EQ(r.arguments[1], "{}");
  EXPECT_EQ(r.content, "Done.");  // after the list: content
  Take(p.Finish(), &r);
  EXPECT_EQ(r.names.size(), 2u);

  // A later element that cannot stream (an unknown function): the calls before it stand, the
  // rest is content.
  r = Parse(Mode::kAuto, ToolCallFormat::kMistral,
            {R"([{"name": "get_time", "arguments": {}}, {"name": "rm", "arguments": {}}])"});
  EXPECT_EQ(r.names, std::vector<std::string>{"get_time"});
  EXPECT_EQ(r.content, R"({"name": "rm", "arguments": {}}])");
  // Cut by max_tokens inside the arguments: the call stands with what came (finish_reason
  // "length" says so), as an enforced call's.
  r = Parse(Mode::kAuto, ToolCallFormat::kLlama3,
            {"<|python_tag|>{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Ro"});
  EXPECT_EQ(r.names, std::vector<std::string>{"get_weather"});
  EXPECT_EQ(r.arguments[0], R"({"city": "Ro)");
  // A call without arguments is parsed whole at the end.
  r = Parse(Mode::kAuto, ToolCallFormat::kLlama3, {R"({"name": "get_time"})"});
  EXPECT_EQ(r.names, std::vector<std::string>{"get_time"});
  EXPECT_EQ(r.arguments[0], "{}");
  const std::string list =
      "[TOOL_CALLS][{\"name\": \"get_time\", \"arguments\": {\"a\": \"}\"}}, "
      "{\"name\": \"get_weather\", \"arguments\": {\"b\": [\"x\"]}}] bye";
  ExpectSameForEverySplit(Mode::kAuto, ToolCallFormat::kMistral, list);
  ExpectSameForEverySplit(Mode::kAuto, ToolCallFormat::kLlama3,
                          R"([{"name": "get_time", "parameters": {"tz": "UTC"}}])");
}

}  // namespace
}  // namespace pd::router::openai
