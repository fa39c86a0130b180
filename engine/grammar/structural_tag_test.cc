#include "engine/grammar/structural_tag.h"

#include <memory>
#include <random>
#include <string>
#include <vector>

#include "engine/grammar/constraint.h"
#include "engine/grammar/matcher.h"
#include "engine/grammar/token_trie.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pd::grammar {
namespace {

using ::testing::HasSubstr;

// The tool-call tag pd-router sends for tool_choice "auto" with a Hermes-format model.
constexpr char kToolTag[] = R"({"type": "structural_tag", "triggers": ["<tool_call>"],
  "structures": [
    {"begin": "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": ",
     "schema": {"type": "object", "properties": {"city": {"type": "string"}},
                "required": ["city"], "additionalProperties": false},
     "end": "}\n</tool_call>"},
    {"begin": "<tool_call>\n{\"name\": \"get_time\", \"arguments\": ",
     "schema": {"type": "object", "additionalProperties": false},
     "end": "}\n</tool_call>"}]})";

std::shared_ptr<const CompiledGrammar> CompileTag(const std::string& json) {
  ConstraintSpec spec;
  spec.kind = ConstraintSpec::Kind::kStructuralTag;
  spec.text = json;
  auto c = CompileConstraint(spec);
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? *c : nullptr;
}

std::string Call(const std::string& name, const std::string& args) {
  return "<tool_call>\n{\"name\": \"" + name + "\", \"arguments\": " + args + "}\n</tool_call>";
}

// Feeds `out` byte by byte; before each byte (and at the end) the token mask must be the set
// of tokens the matcher accepts, the end token (0) when the sentence is complete.
void ExpectMasksEqualTheMatcher(std::shared_ptr<const CompiledGrammar> g,
                                const std::vector<std::string>& vocab, const std::string& out) {
  const TokenTrie trie(vocab, {0});
  Matcher m(std::move(g));
  std::vector<uint32_t> mask;
  for (size_t i = 0; i <= out.size(); ++i) {
    m.FillTokenMask(trie, &mask);
    std::vector<uint32_t> expected(trie.mask_words(), 0);
    for (size_t t = 1; t < vocab.size(); ++t) {
      Matcher copy = m;
      if (copy.AcceptBytes(vocab[t])) expected[t >> 5] |= 1u << (t & 31);
    }
    if (m.CanEnd()) expected[0] |= 1u;
    ASSERT_EQ(mask, expected) << "after " << out.substr(0, i);
    if (i < out.size()) {
      ASSERT_TRUE(m.AcceptByte(static_cast<uint8_t>(out[i]))) << i;
    }
  }
  EXPECT_TRUE(m.CanEnd());
}

TEST(StructuralTagTest, FreeTextAroundCallsThatFollowTheirSchemas) {
  auto g = CompileTag(kToolTag);
  ASSERT_NE(g, nullptr);
  for (const std::string& ok :
       {std::string(""), std::string("Sunny, 21 degrees."),
        std::string("a < b, <tool and <tool_ca are text; \xC3\xA9\xfe bytes too"),
        Call("get_weather", R"({"city": "Lyon"})"),
        "Let me check. " + Call("get_weather", R"({"city":"Lyon"})") + "\n" +
            Call("get_time", "{}") + " Done.",
        "<<tool_call" +
            std::string(">\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>")}) {
    EXPECT_TRUE(Matches(g, ok)) << ok;
  }
  for (const std::string& bad :
       {std::string("<tool_call>"),                  // a call must finish
        Call("get_weather", R"({"town": "Lyon"})"),  // not its schema
        Call("get_weather", R"({})"),                // a required member
        Call("get_date", "{}"),                      // not an offered function
        std::string("x <tool_call> y"),              // the trigger is the call's
        std::string("a \xff b"),  // the special token mark (grammar.h) is never text
        Call("get_time", "{}").substr(0, 40)}) {  // cut inside the call
    EXPECT_FALSE(Matches(g, bad)) << bad;
  }
}

// The tag pd-router sends for tool_choice "auto" with a Llama 3 model: its JSON call is the
// whole output, so the trigger counts only at the start.
constexpr char kLlamaTag[] = R"({"type": "structural_tag", "triggers": ["{"], "at_start": true,
  "structures": [
    {"begin": "{\"name\": \"get_weather\", \"parameters\": ",
     "schema": {"type": "object", "properties": {"city": {"type": "string"}},
                "required": ["city"], "additionalProperties": false},
     "end": "}"},
    {"begin": "{\"name\": \"get_time\", \"parameters\": ",
     "schema": {"type": "object", "additionalProperties": false}, "end": "}"}]})";

TEST(StructuralTagTest, AtStartATriggerCountsOnlyAtTheStartOfTheOutput) {
  auto g = CompileTag(kLlamaTag);
  ASSERT_NE(g, nullptr);
  const std::string weather = R"({"name": "get_weather", "parameters": {"city": "Lyon"}})";
  for (const std::string& ok :
       {std::string(""), std::string("Sunny, 21 degrees."), weather, "\n\n " + weather,
        std::string(R"({"name": "get_time", "parameters": {}})"),
        std::string("Use {braces} and {\"name\": 1} freely here."), std::string(" \n"),
        std::string("\xC3\xA9{")}) {
    EXPECT_TRUE(Matches(g, ok)) << ok;
  }
  for (const std::string& bad :
       {std::string("{"),  // a call must finish
        std::string(R"({"name": "get_weather", "parameters": {"town": "x"}})"),  // its schema
        std::string(R"({"name": "get_date", "parameters": {}})"),  // not an offered function
        std::string("  {\"city\": \"Lyon\"}"),                     // not a call
        std::string("\xff"),                                       // nor the mark
        weather + " and more text"}) {                             // the call ends it
    EXPECT_FALSE(Matches(g, bad)) << bad;
  }
  // Masks equal the matcher, through whitespace and a call.
  std::vector<std::string> vocab = {"", "{\"", "name", "\":", " \"", "get_time", "\",",
                                    "parameters", " {}}", "}", "\n\n", " {", "Hi {"};
  for (int b = 1; b < 256; ++b) vocab.push_back(std::string(1, static_cast<char>(b)));
  const std::string out = "\n\n {\"name\": \"get_time\", \"parameters\": {}}";
  ExpectMasksEqualTheMatcher(g, vocab, out);
  Matcher m(g);
  ASSERT_TRUE(m.AcceptBytes(out));
  EXPECT_TRUE(m.IsFinished());  // nothing may follow the call
  // The canonical form keeps it.
  auto tag = ParseStructuralTag(kLlamaTag);
  ASSERT_TRUE(tag.ok()) << tag.status();
  EXPECT_TRUE(tag->at_start);
  auto again = ParseStructuralTag(StructuralTagJson(*tag));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_TRUE(again->at_start);
  EXPECT_FALSE(ParseStructuralTag(R"({"triggers": ["{"], "at_start": 1, "structures": [
      {"begin": "{", "schema": {}, "end": "}"}]})").ok());
}

TEST(StructuralTagTest, SeveralTriggersAndOnesEndingInsideOthers) {
  // "ab" ends inside "zab": writing "zab" may start the "ab" structure (a trigger found
  // through the automaton's failure links) or the "zab" one.
  auto g = CompileTag(R"({"triggers": ["ab", "<f=", "zab"],
    "structures": [{"begin": "ab", "schema": {"const": 1}, "end": "."},
                   {"begin": "zab!", "schema": {"const": 2}, "end": "."},
                   {"begin": "<f=a>", "schema": {"type": "boolean"}, "end": "</f>"},
                   {"begin": "<f=b>", "schema": {"type": "null"}, "end": "</f>"}]})");
  ASSERT_NE(g, nullptr);
  for (const char* ok : {"x", "xab1.", "aab1.y", "zab1.", "zab!2.z", "<f=a>true</f><f=b>null</f>",
                        "<f<f=a>false</f>"}) {
    EXPECT_TRUE(Matches(g, ok)) << ok;
  }
  for (const char* bad : {"xab2.", "ab", "zab!1.", "zab2.", "<f=c>1</f>", "<f=a>null</f>", "<f=b>null"}) {
    EXPECT_FALSE(Matches(g, bad)) << bad;
  }
}

TEST(StructuralTagTest, MasksEqualTheMatcherThroughTextAndACall) {
  std::vector<std::string> vocab = {"", "<tool_call>", "</tool_call>", "<tool", "_call>", "\n{",
                                    "\"name\"", ": ", "\"get_time\"", ", ", "\"arguments\"",
                                    "{}", "}\n", "}", "Hi", " there", "<", "x<tool_call>\n"};
  for (int b = 1; b < 256; ++b) vocab.push_back(std::string(1, static_cast<char>(b)));
  auto g = CompileTag(kToolTag);
  ASSERT_NE(g, nullptr);
  const std::string out = "Hi there <tool" + std::string("_call>\n{\"name\": \"get_time\", ") +
                          "\"arguments\": {}}\n</tool_call> ok";
  ExpectMasksEqualTheMatcher(g, vocab, out);
}

// Appends 6,000 random tokens of 2-8 bytes from `alphabet` to `vocab`.
void AddRandomTokens(uint32_t seed, const std::string& alphabet, std::vector<std::string>* vocab) {
  std::mt19937 rng(seed);
  for (int i = 0; i < 6000; ++i) {
    std::string s;
    const int len = 2 + static_cast<int>(rng() % 7);
    for (int k = 0; k < len; ++k) s += alphabet[rng() % alphabet.size()];
    vocab->push_back(s);
  }
}

// Feeds `out` byte by byte; before each byte (and at the end) the cached mask must equal the
// uncached walk. Returns how many masks took the free-text path.
int ExpectMasksEqualTheWholeWalk(std::shared_ptr<const CompiledGrammar> g, const TokenTrie& trie,
                                 const std::string& out) {
  Matcher m(std::move(g));
  std::vector<uint32_t> mask, reference;
  int free_text = 0;
  for (size_t i = 0; i <= out.size(); ++i) {
    m.FillTokenMask(trie, &mask);
    free_text += m.last_mask_path() == Matcher::MaskPath::kCutFreeText ? 1 : 0;
    m.FillTokenMaskUncached(trie, &reference);
    EXPECT_EQ(mask, reference) << "after " << out.substr(0, i);
    if (mask != reference) break;
    if (i < out.size() && !m.AcceptByte(static_cast<uint8_t>(out[i]))) {
      ADD_FAILURE() << "byte " << i << " refused";
      break;
    }
  }
  return free_text;
}

// A vocabulary big enough that free-text states are not walked whole (Matcher::kMinCachedWalk):
// their masks take FreeTextMask's path, and must equal the uncached walk at every byte.
TEST(StructuralTagTest, FreeTextMasksEqualTheWholeWalk) {
  std::vector<std::string> vocab = {"",
                                    "<tool_call>",
                                    "</tool_call>",
                                    "<tool",
                                    "_call>",
                                    "\n{",
                                    "\"name\"",
                                    ": ",
                                    "\"get_time\"",
                                    "\"get_weather\"",
                                    ", ",
                                    "\"arguments\"",
                                    "{}",
                                    "}\n",
                                    "}",
                                    "<t",
                                    "ool",
                                    "x<tool_call>\n"};
  for (int b = 1; b < 256; ++b) vocab.push_back(std::string(1, static_cast<char>(b)));
  AddRandomTokens(5, "abcdefghijklmnopqrstuvwxyz0123456789 .,:{}\"\n_<>/\xC3\xA9", &vocab);
  const TokenTrie trie(vocab, {0});
  ASSERT_GT(trie.num_nodes(), Matcher::kMinCachedWalk);
  auto g = CompileTag(kToolTag);
  ASSERT_NE(g, nullptr);
  const std::string out =
      "Hi <t <to <tool_ca <tool_call>\n{\"name\": \"get_weather\", "
      "\"arguments\": {\"city\": \"<tool_call>\"}}\n</tool_call> <<to ok";
  // The trigger's states met for the first time.
  EXPECT_GE(ExpectMasksEqualTheWholeWalk(g, trie, out), 5);
}

TEST(StructuralTagTest, BadTagsAreRefusedNamingTheField) {
  struct Case {
    const char* json;
    const char* message;
  };
  for (const Case& c : std::vector<Case>{
           {"[]", "must be a JSON object"},
           {R"({"structures": [{"begin": "a", "schema": {}, "end": ""}]})", "triggers must be"},
           {R"({"triggers": [""], "structures": []})", "triggers[0] must not be empty"},
           {R"({"triggers": ["<f"], "structures": []})", "structures must be a non-empty"},
           {R"({"triggers": ["<f"], "structures": [{"begin": "<g", "schema": {}, "end": ""}]})",
            "structures[0].begin \"<g\" does not start with a trigger"},
           {R"({"triggers": ["<f", "<g"], "structures": [{"begin": "<f", "schema": {}, "end": ""}]})",
            "triggers[1] \"<g\" begins no structure"},
           {R"({"triggers": ["<f"], "structures": [{"begin": "<f", "end": ""}]})",
            "structures[0].schema must be a JSON Schema"},
           {R"({"triggers": ["<f"], "structures": [{"begin": "<f", "schema": {}, "end": 3}]})",
            "structures[0].end must be a string"},
           {R"({"triggers": ["<f"], "structures": [{"begin": "<f", "schema": {}, "end": "", "x": 1}]})",
            "structures[0].x is not a field"},
           {R"({"type": "json", "triggers": ["<f"], "structures": []})", "type must be"},
           {R"({"triggers": ["<f"], "structures": [{"begin": "<f", "end": "",
               "schema": {"type": "string", "multipleOf": 2}}]})",
            "structures[0].schema"},
       }) {
    ConstraintSpec spec;
    spec.kind = ConstraintSpec::Kind::kStructuralTag;
    spec.text = c.json;
    auto compiled = CompileConstraint(spec);
    ASSERT_FALSE(compiled.ok()) << c.json;
    EXPECT_EQ(compiled.status().code(), absl::StatusCode::kInvalidArgument) << c.json;
    EXPECT_THAT(std::string(compiled.status().message()), HasSubstr(c.message)) << c.json;
  }
  std::string long_trigger(kMaxTriggerBytes + 1, 'a');
  auto tag = ParseStructuralTag(R"({"triggers": [")" + long_trigger +
                                R"("], "structures": [{"begin": "a", "schema": {}, "end": ""}]})");
  ASSERT_FALSE(tag.ok());
  EXPECT_THAT(std::string(tag.status().message()), HasSubstr("at most 64"));
}

TEST(StructuralTagTest, ReasoningBlockBeforeTheConstrainedAnswer) {
  ConstraintSpec spec;
  spec.kind = ConstraintSpec::Kind::kJsonSchema;
  spec.text = R"({"type": "object", "properties": {"a": {"type": "integer"}},
                  "required": ["a"], "additionalProperties": false})";
  spec.reasoning_start = "<think>";
  spec.reasoning_end = "</think>";
  // The model may think first (or not), then answers by the schema.
  auto g = CompileConstraint(spec);
  ASSERT_TRUE(g.ok()) << g.status();
  for (const char* ok : {"{\"a\":1}", "<think></think>{\"a\":1}",
                         "<think>Let me think. {not json} </think\n</think>\n\n{\"a\": 2}"}) {
    EXPECT_TRUE(Matches(*g, ok)) << ok;
  }
  for (const char* bad : {"<think>still thinking", "<think>x</think>\n\n\n{\"a\":1}",
                          "<think>x</think>{\"b\":1}", "Sure! {\"a\":1}", ""}) {
    EXPECT_FALSE(Matches(*g, bad)) << bad;
  }
  // The prompt opened the block: the output starts inside it and must close it.
  spec.reasoning_opened = true;
  g = CompileConstraint(spec);
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_TRUE(Matches(*g, "thinking...</think>\n{\"a\":3}"));
  EXPECT_TRUE(Matches(*g, "</think>{\"a\":3}"));
  EXPECT_FALSE(Matches(*g, "{\"a\":3}"));
  // Cached apart from the same schema without a block.
  GrammarCache cache;
  auto with = cache.Get(spec);
  spec.reasoning_end.clear();
  auto without = cache.Get(spec);
  ASSERT_TRUE(with.ok() && without.ok());
  EXPECT_NE(*with, *without);
  EXPECT_TRUE(Matches(*without, "{\"a\":3}"));
}

// Mistral's tool calls: `[TOOL_CALLS]` (v3: a list of calls; v11: `[TOOL_CALLS]name[ARGS]{...}`)
// is a special token, written by the grammar as its bytes (SpecialTokenBytes), never as text.
constexpr char kMistralListTag[] = R"({"triggers": ["[TOOL_CALLS]"], "at_start": true,
  "special_tokens": ["[TOOL_CALLS]"],
  "structures": [{"begin": "[TOOL_CALLS]", "end": "", "schema": {"type": "array", "minItems": 1,
    "items": {"type": "object", "properties": {"name": {"const": "get_time"}, "arguments":
      {"type": "object", "additionalProperties": false}}, "required": ["name", "arguments"],
      "additionalProperties": false}}}]})";
constexpr char kMistralNamedTag[] = R"({"triggers": ["[TOOL_CALLS]"],
  "special_tokens": ["[TOOL_CALLS]", "[ARGS]"],
  "structures": [{"begin": "[TOOL_CALLS]get_time[ARGS]", "end": "",
                  "schema": {"type": "object", "additionalProperties": false}},
                 {"begin": "[TOOL_CALLS]get_weather[ARGS]", "end": "",
                  "schema": {"type": "object", "properties": {"city": {"const": "Oslo"}},
                             "required": ["city"], "additionalProperties": false}}]})";

TEST(StructuralTagTest, SpecialTokensAreWrittenOnlyWhereATagNamesThem) {
  const std::string calls = SpecialTokenBytes("[TOOL_CALLS]");
  const std::string args = SpecialTokenBytes("[ARGS]");
  auto list = CompileTag(kMistralListTag);
  ASSERT_NE(list, nullptr);
  const std::string call = R"([{"name": "get_time", "arguments": {}}])";
  for (const std::string& ok : {std::string(""), std::string("Hello [TOOL_CALLS] text"),
                                calls + call, " \n" + calls + call}) {
    EXPECT_TRUE(Matches(list, ok)) << ok;
  }
  for (const std::string& bad : {calls, calls + call + "x",  // the call ends the output
                                 "Hi " + calls + call,       // at the start only
                                 calls + R"([{"name": "get_date", "arguments": {}}])", args,
                                 "\xff[TOOL_CALLS]" + call}) {  // half a special token is nothing
    EXPECT_FALSE(Matches(list, bad)) << bad;
  }
  auto named = CompileTag(kMistralNamedTag);
  ASSERT_NE(named, nullptr);
  for (const std::string& ok :
       {std::string("text [TOOL_CALLS]get_time[ARGS]{} is text"), calls + "get_time" + args + "{}",
        "Sure. " + calls + "get_weather" + args + R"({"city": "Oslo"})" + calls + "get_time" +
            args + "{} done"}) {
    EXPECT_TRUE(Matches(named, ok)) << ok;
  }
  for (const std::string& bad :
       {calls + "get_time[ARGS]{}", calls + "get_time" + args + R"({"city": "Oslo"})",
        calls + "get_date" + args + "{}", "x" + args, calls + "get_time" + args}) {
    EXPECT_FALSE(Matches(named, bad)) << bad;
  }
  // Token masks: the special tokens' trie bytes are their grammar bytes; other special tokens
  // ([INST] here) are never allowed, and neither is a byte-fallback token's 0xFF.
  std::vector<std::string> vocab = {"",
                                    calls,
                                    args,
                                    SpecialTokenBytes("[INST]"),
                                    "get",
                                    "_time",
                                    "{}",
                                    "[{\"name\": \"get_time\"",
                                    ", ",
                                    "\"arguments\"",
                                    ": {}}]",
                                    " x",
                                    "[TOOL_CALLS]",
                                    "\xf0\x9f\x98"};
  for (int b = 1; b < 255; ++b) vocab.push_back(std::string(1, static_cast<char>(b)));
  ExpectMasksEqualTheMatcher(named, vocab, "x " + calls + "get_time" + args + "{} y");
  ExpectMasksEqualTheMatcher(list, vocab, " " + calls + call);
  const TokenTrie trie(vocab, {0});
  Matcher m(list);
  std::vector<uint32_t> mask;
  m.FillTokenMask(trie, &mask);
  EXPECT_TRUE(mask[0] & (1u << 1)) << "[TOOL_CALLS] may start the output";
  EXPECT_FALSE(mask[0] & (1u << 2)) << "[ARGS] is not in this tag";
  EXPECT_FALSE(mask[0] & (1u << 3)) << "[INST] is never allowed";
  // A byte-fallback token's 0xFF would begin a special token's bytes: it stands for nothing.
  EXPECT_EQ(TokenGrammarBytes("\xff", ""), "");
  EXPECT_EQ(TokenGrammarBytes("a\xff", ""), "");
  EXPECT_EQ(TokenGrammarBytes("", "[TOOL_CALLS]"), calls);
  EXPECT_EQ(TokenGrammarBytes("\xf0\x9f\x98", ""), "\xf0\x9f\x98");
  ASSERT_TRUE(m.AcceptBytes("Hi"));
  m.FillTokenMask(trie, &mask);
  EXPECT_FALSE(mask[0] & (1u << 1)) << "after text, no call";
  // The canonical form keeps the special tokens.
  auto tag = ParseStructuralTag(kMistralNamedTag);
  ASSERT_TRUE(tag.ok()) << tag.status();
  auto again = ParseStructuralTag(StructuralTagJson(*tag));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->special_tokens, tag->special_tokens);
  // Refused: a special token inside a trigger, an empty or repeated one, a wrong type.
  for (const auto& [json, message] : std::vector<std::pair<std::string, std::string>>{
           {R"({"triggers": ["x[A]"], "special_tokens": ["[A]"],
                "structures": [{"begin": "x[A]", "schema": {}, "end": ""}]})",
            "triggers[0] holds a special token after its start"},
           {R"({"triggers": ["x"], "special_tokens": [""],
                "structures": [{"begin": "x", "schema": {}, "end": ""}]})",
            "special_tokens[0] must be a non-empty string"},
           {R"({"triggers": ["x"], "special_tokens": ["[A]", "[A]"],
                "structures": [{"begin": "x", "schema": {}, "end": ""}]})",
            "special_tokens[1] \"[A]\" is listed twice"},
           {R"({"triggers": ["x"], "special_tokens": "[A]",
                "structures": [{"begin": "x", "schema": {}, "end": ""}]})",
            "special_tokens must be an array"},
           // "[A]" is the token: "[A" does not start "[A]x" as the grammar reads it.
           {R"({"triggers": ["[A"], "special_tokens": ["[A]"],
                "structures": [{"begin": "[A]x", "schema": {}, "end": ""}]})",
            "does not start with a trigger"}}) {
    auto bad = ParseStructuralTag(json);
    ASSERT_FALSE(bad.ok()) << json;
    EXPECT_THAT(std::string(bad.status().message()), HasSubstr(message)) << json;
  }
}

// Free text with special-token triggers on a big vocabulary (FreeTextMask's path): the
// special tokens hold the mark, which moves the free state, so they are walked one by one; the
// masks equal the uncached walk at every byte.
TEST(StructuralTagTest, FreeTextMasksWithSpecialTokensEqualTheWholeWalk) {
  const std::string calls = SpecialTokenBytes("[TOOL_CALLS]");
  const std::string args = SpecialTokenBytes("[ARGS]");
  std::vector<std::string> vocab = {"", calls, args, "get", "_time", "{}", "get_time", " x"};
  for (int i = 0; i < 300; ++i) {
    vocab.push_back(SpecialTokenBytes("<SPECIAL_" + std::to_string(i) + ">"));
  }
  for (int b = 1; b < 255; ++b) vocab.push_back(std::string(1, static_cast<char>(b)));
  AddRandomTokens(7, "abcdefghijklmnopqrstuvwxyz0123456789 .,:{}\"\n_[]<>/\xC3\xA9", &vocab);
  const TokenTrie trie(vocab, {0});
  ASSERT_GT(trie.num_nodes(), Matcher::kMinCachedWalk);
  auto g = CompileTag(kMistralNamedTag);
  ASSERT_NE(g, nullptr);
  const std::string out = "Hi [TOOL_CALLS] " + calls + "get_time" + args + "{} and " + calls +
                          "get_weather" + args + "{\"city\": \"Oslo\"} ok";
  EXPECT_GE(ExpectMasksEqualTheWholeWalk(g, trie, out), 1);
}

TEST(StructuralTagTest, CanonicalJsonRoundTrips) {
  auto tag = ParseStructuralTag(kToolTag);
  ASSERT_TRUE(tag.ok()) << tag.status();
  auto again = ParseStructuralTag(StructuralTagJson(*tag));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(StructuralTagJson(*again), StructuralTagJson(*tag));
  ASSERT_EQ(again->structures.size(), 2u);
  EXPECT_EQ(again->structures[1].end, "}\n</tool_call>");
}

}  // namespace
}  // namespace pd::grammar
