#include "services/router/openai/openai_request.h"

#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pd::router::openai {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

absl::StatusOr<OpenAiRequest> Completions(const std::string& body) {
  return ParseRequest(Endpoint::kCompletions, body, ParseLimits());
}
absl::StatusOr<OpenAiRequest> Chat(const std::string& body) {
  return ParseRequest(Endpoint::kChat, body, ParseLimits());
}

// The error names the field both in its message and as its param.
void ExpectBad(const absl::StatusOr<OpenAiRequest>& r, const std::string& param,
               const std::string& message_part) {
  ASSERT_FALSE(r.ok()) << "expected an error naming " << param;
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
  EXPECT_EQ(ParamOf(r.status()), param) << r.status();
  EXPECT_THAT(r.status().message(), HasSubstr(message_part));
}

TEST(OpenAiRequestTest, CompletionsDefaultsFollowOpenAi) {
  absl::StatusOr<OpenAiRequest> r = Completions(R"({"model": "m", "prompt": "Once upon"})");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->model, "m");
  EXPECT_EQ(r->prompt_text, "Once upon");
  EXPECT_FALSE(r->prompt_ids.has_value());
  EXPECT_EQ(r->sampling.max_tokens(), 16u);
  EXPECT_FLOAT_EQ(r->sampling.temperature(), 1.0f);
  EXPECT_FLOAT_EQ(r->sampling.top_p(), 1.0f);
  EXPECT_FALSE(r->sampling.has_seed());
  EXPECT_FALSE(r->stream);
  EXPECT_EQ(r->logprobs, -1);
}

TEST(OpenAiRequestTest, CompletionsFieldsMapToSampling) {
  absl::StatusOr<OpenAiRequest> r = Completions(R"({
      "model": "m", "prompt": [1, 2, 3], "max_tokens": 7, "temperature": 0, "top_p": 0.5,
      "top_k": 40, "seed": 42, "stop": ["\n", "END"], "stream": true,
      "stream_options": {"include_usage": true}, "ignore_eos": true, "min_tokens": 2,
      "stop_token_ids": [5], "n": 1, "user": "u", "presence_penalty": 0, "echo": false,
      "cache_salt": "s"})");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_THAT(*r->prompt_ids, ElementsAre(1, 2, 3));
  EXPECT_EQ(r->sampling.max_tokens(), 7u);
  EXPECT_FLOAT_EQ(r->sampling.temperature(), 0.0f);
  EXPECT_FLOAT_EQ(r->sampling.top_p(), 0.5f);
  EXPECT_EQ(r->sampling.top_k(), 40u);
  EXPECT_EQ(r->sampling.seed(), 42u);
  EXPECT_THAT(r->sampling.stop(), ElementsAre("\n", "END"));
  EXPECT_THAT(r->sampling.stop_token_ids(), ElementsAre(5u));
  EXPECT_TRUE(r->sampling.ignore_eos());
  EXPECT_EQ(r->sampling.min_tokens(), 2u);
  EXPECT_TRUE(r->stream);
  EXPECT_TRUE(r->include_usage);
  EXPECT_EQ(r->cache_salt, "s");
}

TEST(OpenAiRequestTest, PromptForms) {
  EXPECT_EQ(Completions(R"({"model":"m","prompt":["hi"]})")->prompt_text, "hi");
  EXPECT_THAT(*Completions(R"({"model":"m","prompt":[[4,5]]})")->prompt_ids, ElementsAre(4, 5));
  ExpectBad(Completions(R"({"model":"m","prompt":["a","b"]})"), "prompt", "batches");
  ExpectBad(Completions(R"({"model":"m","prompt":[]})"), "prompt", "empty");
  ExpectBad(Completions(R"({"model":"m","prompt":[1,-2]})"), "prompt[1]", "must be in");
  ExpectBad(Completions(R"({"model":"m","prompt":[1,2.5]})"), "prompt[1]", "integer");
  ExpectBad(Completions(R"({"model":"m","prompt":7})"), "prompt", "string or an array");
  ExpectBad(Completions(R"({"model":"m"})"), "prompt", "required");
  ExpectBad(Completions(R"({"prompt":"x"})"), "model", "required");
}

// Exactly the documented forms: a string, token ids, or a one-element array of either. Deeper
// arrays are refused at the first level that is not one of them (never walked recursively).
TEST(OpenAiRequestTest, PromptNestingIsRefusedBeyondTheDocumentedForms) {
  ExpectBad(Completions(R"({"model":"m","prompt":[[[5]]]})"), "prompt[0][0]", "integer");
  ExpectBad(Completions(R"({"model":"m","prompt":[["hi"]]})"), "prompt[0][0]", "integer");
  ExpectBad(Completions(R"({"model":"m","prompt":[[]]})"), "prompt", "empty");
  ExpectBad(Completions(R"({"model":"m","prompt":[[1],[2]]})"), "prompt", "batches");
  ExpectBad(Completions(R"({"model":"m","prompt":[5,[6]]})"), "prompt[1]", "integer");
  // 60 levels pass the depth bound, so the prompt check itself refuses them.
  const std::string sixty = std::string(60, '[') + "5" + std::string(60, ']');
  ExpectBad(Completions(absl::StrCat(R"({"model":"m","prompt":)", sixty, "}")), "prompt[0][0]",
            "integer");
}

// A body nesting deeper than max_json_depth is refused before it is parsed, naming the
// top-level field it nests under; the scan ignores brackets inside strings.
TEST(OpenAiRequestTest, DeepNestingIsRefusedBeforeParsing) {
  for (size_t levels : {65u, 1000u, 100000u}) {
    const std::string deep = std::string(levels, '[') + "5" + std::string(levels, ']');
    ExpectBad(Completions(absl::StrCat(R"({"model":"m","prompt":)", deep, "}")), "prompt",
              "nested deeper than 64");
    ExpectBad(Completions(absl::StrCat(R"({"model":"m","prompt":"x","metadata":)", deep, "}")),
              "metadata", "nested deeper than 64");
  }
  const std::string objects = [] {
    std::string s;
    for (int i = 0; i < 200; ++i) s += R"({"a":)";
    return s + "1" + std::string(200, '}');
  }();
  ExpectBad(Chat(absl::StrCat(R"({"model":"m","messages":[{"role":"user","content":"x"}],)",
                              R"("tools":)", objects, "}")),
            "tools", "nested deeper than 64");
  // Unclosed: still bounded, and named.
  ExpectBad(Completions(R"({"model":"m","stop":)" + std::string(500, '[')), "stop",
            "nested deeper");
  // Brackets and escaped quotes inside strings do not count.
  EXPECT_TRUE(
      Completions(absl::StrCat(R"({"model":"m","prompt":"\")", std::string(500, '['), R"("})"))
          .ok());
  EXPECT_EQ(JsonNestingDepth(R"({"a":[{"b":"[[[{"}]})", 64).depth, 3u);
  EXPECT_EQ(JsonNestingDepth(R"({"k\"]":[[1]]})", 64).depth, 3u);
}

// metadata is what OpenAI defines: at most 16 string keys of at most 64 characters, to strings
// of at most 512; it changes nothing else.
TEST(OpenAiRequestTest, MetadataIsAMapOfStrings) {
  EXPECT_TRUE(Completions(R"({"model":"m","prompt":"x","metadata":{"a":"1","b":""}})").ok());
  ExpectBad(Completions(R"({"model":"m","prompt":"x","metadata":[["a"]]})"), "metadata",
            "an object");
  ExpectBad(Completions(R"({"model":"m","prompt":"x","metadata":{"a":["b"]}})"), "metadata.a",
            "a string");
  ExpectBad(Completions(R"({"model":"m","prompt":"x","metadata":{"a":{"b":"c"}}})"), "metadata.a",
            "a string");
  std::string many = R"({"model":"m","prompt":"x","metadata":{)";
  for (int i = 0; i < 17; ++i) absl::StrAppend(&many, i ? "," : "", "\"k", i, "\":\"v\"");
  ExpectBad(Completions(many + "}}"), "metadata", "at most 16");
  ExpectBad(Completions(absl::StrCat(R"({"model":"m","prompt":"x","metadata":{")",
                                     std::string(65, 'k'), R"(":"v"}})")),
            "metadata", "at most 64");
  ExpectBad(Completions(absl::StrCat(R"({"model":"m","prompt":"x","metadata":{"k":")",
                                     std::string(513, 'v'), R"("}})")),
            "metadata.k", "at most 512");
  ExpectBad(Completions(R"({"model":"m","prompt":"x","user":["u"]})"), "user", "a string");
  ExpectBad(Completions(R"({"model":"m","prompt":"x","store":"yes"})"), "store", "a boolean");
}

TEST(OpenAiRequestTest, MalformedBodies) {
  for (const char* body : {"", "{", "[1]", "null", "{\"model\": \"m\",}", "\"text\""}) {
    absl::StatusOr<OpenAiRequest> r = Completions(body);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << body;
  }
  // Invalid UTF-8 inside a string.
  const std::string bad_utf8 = std::string(R"({"model":"m","prompt":")") + "\xff\xfe" + "\"}";
  EXPECT_THAT(Completions(bad_utf8).status().message(), HasSubstr("UTF-8"));
}

TEST(OpenAiRequestTest, WrongTypesAndRanges) {
  ExpectBad(Completions(R"({"model":"m","prompt":"x","max_tokens":"5"})"), "max_tokens", "integer");
  ExpectBad(Completions(R"({"model":"m","prompt":"x","max_tokens":0})"), "max_tokens",
            "must be in [1, 131072]");
  ExpectBad(Completions(R"({"model":"m","prompt":"x","max_tokens":100000000})"), "max_tokens",
            "must be in");
  ExpectBad(Completions(R"({"model":"m","prompt":"x","temperature":3})"), "temperature", "[0, 2]");
  ExpectBad(Completions(R"({"model":"m","prompt":"x","top_p":0})"), "top_p", "(0, 1]");
  ExpectBad(Completions(R"({"model":"m","prompt":"x","stream":"yes"})"), "stream", "boolean");
  ExpectBad(Completions(R"({"model":"m","prompt":"x","stop":[""]})"), "stop", "empty");
  ExpectBad(Completions(R"({"model":"m","prompt":"x","stop":[1]})"), "stop[0]", "string");
  ExpectBad(Completions(R"({"model":5,"prompt":"x"})"), "model", "string");
  ExpectBad(Completions(R"({"model":"m","prompt":"x","min_tokens":9,"max_tokens":3})"),
            "min_tokens", "exceed");
  ExpectBad(Completions(R"({"model":"m","prompt":"x","stream_options":{"include_usage":true}})"),
            "stream_options", "stream");
  // An integral float is an integer.
  EXPECT_EQ(Completions(R"({"model":"m","prompt":"x","max_tokens":5.0})")->sampling.max_tokens(),
            5u);
}

TEST(OpenAiRequestTest, UnknownAndUnsupportedFieldsAreRefusedByName) {
  ExpectBad(Completions(R"({"model":"m","prompt":"x","frobnicate":1})"), "frobnicate",
            "unrecognized");
  ExpectBad(Completions(R"({"model":"m","prompt":"x","best_of":3})"), "best_of", "must equal n");
  ExpectBad(Completions(R"({"model":"m","prompt":"x","suffix":"y"})"), "suffix", "not supported");
  ExpectBad(Completions(R"({"model":"m","prompt":"x","echo":true,"logprobs":1})"), "echo",
            "logprobs");
  ExpectBad(Chat(R"({"model":"m","messages":[{"role":"user","content":"x"}],
                    "tools":[{"type":"retrieval"}]})"),
            "tools[0].type", "not supported");
  ExpectBad(Chat(R"({"model":"m","messages":[{"role":"user","content":"x"}],
                    "response_format":{"type":"xml"}})"),
            "response_format.type", "json_schema");
  // Fields at their no-op values, and explicit nulls, are accepted.
  EXPECT_TRUE(Chat(R"({"model":"m","messages":[{"role":"user","content":"x"}],
                      "frequency_penalty":0,"logit_bias":{},"tools":[],"n":null,"stop":null,
                      "response_format":{"type":"text"},"seed":null})")
                  .ok());
}

// Issue #31 section 3: n choices, within ParseLimits::max_n; best_of only as n's equal.
TEST(OpenAiRequestTest, NChoicesWithinTheLimitAndBestOfOnlyAsN) {
  absl::StatusOr<OpenAiRequest> r = Completions(R"({"model":"m","prompt":"x","n":4})");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->n, 4);
  r = Chat(R"({"model":"m","messages":[{"role":"user","content":"x"}],"n":16,"stream":true})");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->n, 16);
  EXPECT_EQ(Completions(R"({"model":"m","prompt":"x"})")->n, 1);
  r = Completions(R"({"model":"m","prompt":"x","best_of":3,"n":3})");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->n, 3);
  ExpectBad(Completions(R"({"model":"m","prompt":"x","n":17})"), "n", "[1, 16], got 17");
  ExpectBad(Completions(R"({"model":"m","prompt":"x","n":0})"), "n", "[1, 16], got 0");
  ExpectBad(Completions(R"({"model":"m","prompt":"x","n":2.5})"), "n", "integer");
  ExpectBad(Completions(R"({"model":"m","prompt":"x","n":2,"best_of":4})"), "best_of",
            "must equal n (2)");
}

// Issue #31 section 3: the penalties, logit_bias and min_p, on both endpoints, at their bounds.
TEST(OpenAiRequestTest, PenaltiesLogitBiasAndMinPMapToSampling) {
  for (const char* base : {R"("prompt":"x")", R"("messages":[{"role":"user","content":"x"}])"}) {
    const std::string body =
        absl::StrCat(R"({"model":"m",)", base,
                     R"(,"presence_penalty":-2,"frequency_penalty":2.0,"repetition_penalty":1.3,)",
                     R"("min_p":0.05,"logit_bias":{"0":-100,"17":2.5,"511":100}})");
    const bool chat = absl::StrContains(base, "messages");
    absl::StatusOr<OpenAiRequest> r = chat ? Chat(body) : Completions(body);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_FLOAT_EQ(r->sampling.presence_penalty(), -2.0f);
    EXPECT_FLOAT_EQ(r->sampling.frequency_penalty(), 2.0f);
    EXPECT_FLOAT_EQ(r->sampling.repetition_penalty(), 1.3f);
    EXPECT_FLOAT_EQ(r->sampling.min_p(), 0.05f);
    ASSERT_EQ(r->sampling.logit_bias_size(), 3);
    EXPECT_FLOAT_EQ(r->sampling.logit_bias().at(0), -100.0f);
    EXPECT_FLOAT_EQ(r->sampling.logit_bias().at(17), 2.5f);
    EXPECT_FLOAT_EQ(r->sampling.logit_bias().at(511), 100.0f);
  }
  // Defaults: nothing set (0 on the wire; repetition 0 = unset = 1).
  absl::StatusOr<OpenAiRequest> r = Completions(R"({"model":"m","prompt":"x"})");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->sampling.repetition_penalty(), 0.0f);
  EXPECT_EQ(r->sampling.logit_bias_size(), 0);
  // 300 entries are fine (OpenAI's limit).
  std::string many = R"({"model":"m","prompt":"x","logit_bias":{)";
  for (int i = 0; i < 300; ++i) absl::StrAppend(&many, i > 0 ? "," : "", "\"", i, "\":1");
  EXPECT_TRUE(Completions(many + "}}").ok());
  ExpectBad(Completions(many + R"(,"300":1}})"), "logit_bias", "at most 300");
}

TEST(OpenAiRequestTest, BadPenaltiesLogitBiasAndMinPAreRefusedByName) {
  auto bad = [](const std::string& field, const std::string& value, const std::string& part) {
    const std::string rest = absl::StrCat(R"(,")", field, R"(":)", value, "}");
    ExpectBad(Completions(absl::StrCat(R"({"model":"m","prompt":"x")", rest)), field, part);
    ExpectBad(
        Chat(absl::StrCat(R"({"model":"m","messages":[{"role":"user","content":"x"}])", rest)),
        field, part);
  };
  bad("presence_penalty", "2.5", "[-2, 2]");
  bad("presence_penalty", "-2.01", "[-2, 2]");
  bad("presence_penalty", "\"1\"", "a number");
  bad("frequency_penalty", "3", "[-2, 2]");
  bad("frequency_penalty", "true", "a number");
  bad("repetition_penalty", "0", "> 0");
  bad("repetition_penalty", "-1", "> 0");
  bad("repetition_penalty", "1e-50", "> 0");  // rounds to a float 0
  bad("repetition_penalty", "[1]", "a number");
  bad("min_p", "1.5", "[0, 1]");
  bad("min_p", "-0.1", "[0, 1]");
  bad("logit_bias", "[1]", "an object");
  bad("logit_bias", R"({"abc":1})", "key \"abc\" is not a token id");
  bad("logit_bias", R"({"-5":1})", "key \"-5\" is not a token id");
  bad("logit_bias", R"({"99999999999":1})", "is not a token id");
  bad("logit_bias", R"({"5":101})", "key \"5\": the bias must be in [-100, 100]");
  bad("logit_bias", R"({"5":"1"})", "key \"5\": the bias must be a number");
  EXPECT_TRUE(Completions(R"({"model":"m","prompt":"x","min_p":null,"logit_bias":null})").ok());
  // With the vocabulary known (the HTTP front sets it), an id past it names the key.
  ParseLimits limits;
  limits.vocab_size = 512;
  ExpectBad(ParseRequest(Endpoint::kCompletions,
                         R"({"model":"m","prompt":"x","logit_bias":{"3":1,"512":-100}})", limits),
            "logit_bias", "key \"512\": token id 512 is not in the vocabulary (its size is 512)");
  EXPECT_TRUE(ParseRequest(Endpoint::kCompletions,
                           R"({"model":"m","prompt":"x","logit_bias":{"511":-100}})", limits)
                  .ok());
}

// Structured output: response_format and vLLM's guided_* / structured_outputs become the
// request's constraint; the schema keeps its key order (the order the output's keys take).
TEST(OpenAiRequestTest, StructuredOutputConstraints) {
  absl::StatusOr<OpenAiRequest> r = Chat(R"({"model":"m","messages":[{"role":"user","content":"x"}],
               "response_format":{"type":"json_schema","json_schema":{"name":"p","strict":true,
               "schema":{"type":"object","properties":{"zeta":{"type":"integer"},"alpha":{}}}}}})");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->sampling.constraint().json_schema(),
            R"({"type":"object","properties":{"zeta":{"type":"integer"},"alpha":{}}})");
  r = Chat(R"({"model":"m","messages":[{"role":"user","content":"x"}],
               "response_format":{"type":"json_object"}})");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->sampling.constraint().json_object());
  r = Completions(R"({"model":"m","prompt":"x","guided_regex":"[a-z]+"})");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->sampling.constraint().regex(), "[a-z]+");
  r = Completions(R"({"model":"m","prompt":"x","guided_choice":["yes","no"]})");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->sampling.constraint().choice().values_size(), 2);
  r = Completions(R"({"model":"m","prompt":"x","guided_json":"{\"type\":\"string\"}"})");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->sampling.constraint().json_schema(), R"({"type":"string"})");
  r = Completions(R"({"model":"m","prompt":"x","structured_outputs":{"choice":["a"]}})");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->sampling.constraint().choice().values(0), "a");
  r = Completions(R"({"model":"m","prompt":"x","response_format":{"type":"text"}})");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(r->sampling.has_constraint());

  ExpectBad(Completions(R"({"model":"m","prompt":"x","guided_regex":"a","guided_choice":["a"]})"),
            "guided_choice", "conflicts with guided_regex");
  ExpectBad(Completions(R"({"model":"m","prompt":"x","response_format":{"type":"json_schema"}})"),
            "response_format.json_schema", "required");
  ExpectBad(Completions(R"({"model":"m","prompt":"x",
                           "response_format":{"type":"json_schema","json_schema":{"name":"n"}}})"),
            "response_format.json_schema.schema", "required");
  ExpectBad(Completions(R"({"model":"m","prompt":"x","guided_choice":[]})"), "guided_choice",
            "non-empty");
  ExpectBad(Completions(R"({"model":"m","prompt":"x","guided_choice":["a",1]})"),
            "guided_choice[1]", "string");
  ExpectBad(Completions(R"({"model":"m","prompt":"x","guided_json":"{nope"})"), "guided_json",
            "not a JSON document");
  r = Completions(R"({"model":"m","prompt":"x","guided_grammar":"root ::= \"a\""})");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->sampling.constraint().grammar(), "root ::= \"a\"");
  r = Completions(R"({"model":"m","prompt":"x","structured_outputs":{"grammar":"root ::= [a-z]+"}})");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->sampling.constraint().grammar(), "root ::= [a-z]+");
  ExpectBad(Completions(R"({"model":"m","prompt":"x","guided_grammar":{"root":"a"}})"),
            "guided_grammar", "must be a string");
  ExpectBad(Completions(R"({"model":"m","prompt":"x","structured_outputs":{"structural_tag":"x"}})"),
            "structured_outputs.structural_tag", "not a JSON document");
  ExpectBad(Completions(R"({"model":"m","prompt":"x","structured_outputs":{"structural_tag":3}})"),
            "structured_outputs.structural_tag", "must be a structural tag");
  r = Completions(R"({"model":"m","prompt":"x","structured_outputs":{"structural_tag":
                     "{\"triggers\":[\"<f\"],\"structures\":[]}"}})");
  ASSERT_TRUE(r.ok()) << r.status();  // the tag itself is checked where it is compiled
  EXPECT_EQ(r->sampling.constraint().structural_tag(), R"({"triggers":["<f"],"structures":[]})");
  r = Chat(R"({"model":"m","messages":[{"role":"user","content":"x"}],
               "response_format":{"type":"structural_tag","triggers":["<f="],
                 "structures":[{"begin":"<f=a>","schema":{"type":"integer"},"end":"</f>"}]}})");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->sampling.constraint().structural_tag(),
            R"({"type":"structural_tag","triggers":["<f="],)"
            R"("structures":[{"begin":"<f=a>","schema":{"type":"integer"},"end":"</f>"}]})");
  ExpectBad(Completions(R"({"model":"m","prompt":"x","response_format":{"type":"structural_tag",
                           "format":{"type":"triggered_tags"}}})"),
            "response_format.format", "structures");
  ExpectBad(Completions(R"({"model":"m","prompt":"x","guided_regex":"a","ignore_eos":true})"),
            "ignore_eos", "structured output");
}

TEST(OpenAiRequestTest, ChatMessages) {
  absl::StatusOr<OpenAiRequest> r = Chat(R"({"model":"m","messages":[
      {"role":"developer","content":"be brief"},
      {"role":"user","content":[{"type":"text","text":"Hello "},{"type":"text","text":"there"}]},
      {"role":"assistant","content":null},
      {"role":"user","content":"again","name":"bob"}],
      "max_completion_tokens": 9, "logprobs": true, "top_logprobs": 3})");
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->messages.size(), 4u);
  EXPECT_EQ(r->messages[0].role, "system");
  EXPECT_EQ(r->messages[1].content, "Hello there");
  EXPECT_EQ(r->messages[2].role, "assistant");
  EXPECT_EQ(r->messages[2].content, "");
  EXPECT_EQ(r->sampling.max_tokens(), 9u);
  EXPECT_EQ(r->logprobs, 3);
  EXPECT_TRUE(r->add_generation_prompt);
  // Chat's default max_tokens is unbounded (0 = until the context is full).
  EXPECT_EQ(
      Chat(R"({"model":"m","messages":[{"role":"user","content":"x"}]})")->sampling.max_tokens(),
      0u);
}

TEST(OpenAiRequestTest, ChatErrorsNameTheMessage) {
  ExpectBad(Chat(R"({"model":"m","messages":[]})"), "messages", "empty");
  ExpectBad(Chat(R"({"model":"m"})"), "messages", "required");
  ExpectBad(Chat(R"({"model":"m","messages":[{"role":"critic","content":"x"}]})"),
            "messages[0].role", "not supported");
  ExpectBad(Chat(R"({"model":"m","messages":[{"content":"x"}]})"), "messages[0].role", "required");
  ExpectBad(Chat(R"({"model":"m","messages":[{"role":"user"}]})"), "messages[0].content",
            "required");
  ExpectBad(Chat(R"({"model":"m","messages":[{"role":"user","content":null}]})"),
            "messages[0].content", "null");
  ExpectBad(Chat(R"({"model":"m","messages":[{"role":"user","content":[{"type":"image_url",
                    "image_url":{"url":"x"}}]}]})"),
            "messages[0].content[0].type", "image_url");
  ExpectBad(Chat(R"({"model":"m","messages":[{"role":"user","content":"x","extra":1}]})"),
            "messages[0].extra", "unrecognized");
  ExpectBad(Chat(R"({"model":"m","messages":[{"role":"user","content":"x"}],"top_logprobs":2})"),
            "top_logprobs", "logprobs");
  ExpectBad(Chat(R"({"model":"m","messages":[{"role":"user","content":"x"}],"logprobs":true,
                    "top_logprobs":21})"),
            "top_logprobs", "[0, 20]");
  // prompt belongs to completions, messages to chat.
  ExpectBad(Chat(R"({"model":"m","prompt":"x","messages":[{"role":"user","content":"x"}]})"),
            "prompt", "unrecognized");
}

TEST(OpenAiRequestTest, ParamSurvivesOnlyOnTaggedStatuses) {
  EXPECT_EQ(ParamOf(absl::InvalidArgumentError("x")), "");
  EXPECT_EQ(ParamOf(WithParam(absl::NotFoundError("x"), "model")), "model");
}

}  // namespace
}  // namespace pd::router::openai
