// The socket-free parts of the HTTP routes: the metric label of a path, the error objects of
// errors httplib answers itself, and the GenerateRequest an OpenAI request becomes (against the
// real stories260K tokenizer and a chat template).
#include "services/router/openai/http_routes.h"

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "services/router/stories_front_test_util.h"

namespace pd::router::openai {
namespace {

namespace v1 = pdserve::v1;

using ::testing::ElementsAreArray;
using ::testing::HasSubstr;

TEST(RouteLabelTest, RoutesByPatternEverythingElseIsOther) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"/health", "/health"},
      {"/v1/models", "/v1/models"},
      {"/v1/models/stories260K", "/v1/models/{id}"},
      {"/v1/models/any-client-chosen-id", "/v1/models/{id}"},
      {"/v1/completions", "/v1/completions"},
      {"/v1/chat/completions", "/v1/chat/completions"},
      {"/v1/completions/x", "other"},
      {"/", "other"}};
  for (const auto& [path, label] : cases) {
    EXPECT_EQ(RouteLabel(path), label) << path;
  }
}

TEST(HttpLayerErrorTest, NamesTheProblem) {
  ApiError e = HttpLayerError(404, "GET", "/v2/nothing");
  EXPECT_EQ(e.http_status, 404);
  EXPECT_EQ(e.message, "no such endpoint: GET /v2/nothing");
  EXPECT_EQ(e.code, "not_found");
  EXPECT_EQ(e.type, "invalid_request_error");
  e = HttpLayerError(413, "POST", "/v1/completions");
  EXPECT_EQ(e.code, "request_too_large");
  EXPECT_THAT(e.message, HasSubstr("--http_max_body_bytes"));
  e = HttpLayerError(400, "POST", "/v1/completions");
  EXPECT_EQ(e.message, "http error 400");
  EXPECT_EQ(e.type, "invalid_request_error");
  e = HttpLayerError(500, "GET", "/health");
  EXPECT_EQ(e.type, "server_error");
}

class ToGenerateRequestTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_NO_FATAL_FAILURE(LoadStoriesFront(&model_)); }

  static OpenAiRequest Parse(Endpoint endpoint, absl::string_view body) {
    absl::StatusOr<OpenAiRequest> r = ParseRequest(endpoint, body, ParseLimits());
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? *r : OpenAiRequest();
  }

  std::unique_ptr<chat::ChatTemplate> Template(const chat::ChatTemplateLimits& limits = {}) {
    absl::StatusOr<chat::ChatTemplate> t = chat::ChatTemplate::Create(
        "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}", "", "", limits);
    EXPECT_TRUE(t.ok()) << t.status();
    return std::make_unique<chat::ChatTemplate>(*std::move(t));
  }

  std::unique_ptr<engine::ModelFront> model_;
};

TEST_F(ToGenerateRequestTest, CompletionTextIsPassedOnWithItsSettings) {
  PromptEncoder prompts(model_.get(), nullptr);
  const OpenAiRequest r =
      Parse(Endpoint::kCompletions, R"({"model":"m","prompt":"Once upon","echo":true,)"
                                    R"("max_tokens":5,"cache_salt":"s1","temperature":0})");
  std::string echo;
  absl::StatusOr<v1::GenerateRequest> g = ToGenerateRequest(r, prompts, model_->tokenizer(), &echo);
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(g->model(), "m");
  EXPECT_EQ(g->text(), "Once upon");  // GenerationService tokenizes it (PromptEncoder::Encode)
  EXPECT_EQ(echo, "Once upon");
  EXPECT_EQ(g->sampling().max_tokens(), 5u);
  EXPECT_EQ(g->sampling().temperature(), 0.0f);
  EXPECT_FALSE(g->sampling().has_logprobs());
  EXPECT_EQ(g->cache_salt(), "s1");
}

TEST_F(ToGenerateRequestTest, CompletionTokenIdsAreEchoedAsText) {
  PromptEncoder prompts(model_.get(), nullptr);
  absl::StatusOr<std::vector<uint32_t>> ids = model_->tokenizer().Encode("Once upon", false, false);
  ASSERT_TRUE(ids.ok());
  std::string body = R"({"model":"m","echo":true,"prompt":[)";
  for (size_t i = 0; i < ids->size(); ++i) body += (i ? "," : "") + std::to_string((*ids)[i]);
  body += "]}";
  std::string echo;
  absl::StatusOr<v1::GenerateRequest> g =
      ToGenerateRequest(Parse(Endpoint::kCompletions, body), prompts, model_->tokenizer(), &echo);
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_THAT(g->token_ids().ids(), ElementsAreArray(*ids));
  absl::StatusOr<std::string> text = model_->tokenizer().Decode(*ids);
  ASSERT_TRUE(text.ok());
  EXPECT_EQ(echo, *text);
  EXPECT_THAT(echo, HasSubstr("Once upon"));
}

TEST_F(ToGenerateRequestTest, LogprobsAreAskedOfTheWorkers) {
  PromptEncoder prompts(model_.get(), nullptr);
  std::string echo;
  absl::StatusOr<v1::GenerateRequest> g = ToGenerateRequest(
      Parse(Endpoint::kCompletions, R"({"model":"m","prompt":"Once","logprobs":2})"), prompts,
      model_->tokenizer(), &echo);
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(g->sampling().logprobs(), 2u);
  EXPECT_TRUE(echo.empty());
}

TEST_F(ToGenerateRequestTest, ChatBecomesTheEncodersTokens) {
  PromptEncoder prompts(model_.get(), Template());
  const OpenAiRequest r = Parse(
      Endpoint::kChat,
      R"({"model":"m","messages":[{"role":"system","content":"Be brief."},)"
      R"({"role":"user","content":[{"type":"text","text":"Hi"},{"type":"text","text":"!"}]}]})");
  std::string echo;
  absl::StatusOr<v1::GenerateRequest> g = ToGenerateRequest(r, prompts, model_->tokenizer(), &echo);
  ASSERT_TRUE(g.ok()) << g.status();
  absl::StatusOr<std::vector<uint32_t>> want =
      prompts.EncodeChat({{"system", "Be brief."}, {"user", "Hi!"}}, true);
  ASSERT_TRUE(want.ok()) << want.status();
  EXPECT_THAT(g->token_ids().ids(), ElementsAreArray(*want));
  EXPECT_TRUE(echo.empty());
}

// Tools and the tool-calling history reach the template as Hugging Face passes them: `tools`
// (unless tool_choice is "none"), an assistant's tool_calls with arguments as an object, a
// tool message's tool_call_id. A null content: this template tests `content is none` (as
// DeepSeek's does), so it sees None; one that does not sees "" (as vLLM passes it:
// chat_template_test.cc).
TEST_F(ToGenerateRequestTest, ChatToolsAndHistoryReachTheTemplate) {
  absl::StatusOr<chat::ChatTemplate> t = chat::ChatTemplate::Create(
      "{% if tools %}TOOLS{% for t in tools %} {{ t.function.name }}{% endfor %}; {% endif %}"
      "{% for m in messages %}{{ m.role }}:{% if m.content is none %} none{% else %} "
      "{{ m.content }}{% endif %}{% if m.tool_calls %} call {{ m.tool_calls[0].function.name }}("
      "{{ m.tool_calls[0].function.arguments.city }}){% endif %}{% if m.tool_call_id %} id "
      "{{ m.tool_call_id }}{% endif %}; {% endfor %}",
      "", "");
  ASSERT_TRUE(t.ok()) << t.status();
  PromptEncoder prompts(model_.get(), std::make_unique<chat::ChatTemplate>(*std::move(t)));
  const std::string history =
      R"({"model":"m","messages":[{"role":"user","content":"hi"},)"
      R"({"role":"assistant","content":null,"tool_calls":[{"id":"call_1","type":"function",)"
      R"("function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"}}]},)"
      R"({"role":"tool","tool_call_id":"call_1","content":"sunny"}],)"
      R"("tools":[{"type":"function","function":{"name":"get_weather"}}])";
  auto render = [&](const std::string& body) {
    std::string echo;
    absl::StatusOr<v1::GenerateRequest> g =
        ToGenerateRequest(Parse(Endpoint::kChat, body), prompts, model_->tokenizer(), &echo);
    EXPECT_TRUE(g.ok()) << g.status();
    if (!g.ok()) return std::string();
    std::vector<uint32_t> ids(g->token_ids().ids().begin(), g->token_ids().ids().end());
    absl::StatusOr<std::string> text = model_->tokenizer().Decode(ids);
    EXPECT_TRUE(text.ok());
    return text.ok() ? *text : std::string();
  };
  const std::string offered = render(history + "}");
  EXPECT_THAT(offered, HasSubstr("TOOLS get_weather; user: hi; assistant: none call "
                                 "get_weather(Paris); tool: sunny id call_1; "));
  const std::string none = render(history + R"(,"tool_choice":"none"})");
  EXPECT_THAT(none, ::testing::Not(HasSubstr("TOOLS")));
  EXPECT_THAT(none, HasSubstr("assistant: none call get_weather(Paris)"));
}

TEST_F(ToGenerateRequestTest, ChatErrorsNameMessagesButBusyNamesNothing) {
  const OpenAiRequest r =
      Parse(Endpoint::kChat, R"({"model":"m","messages":[{"role":"user","content":"Hi"}]})");
  std::string echo;
  PromptEncoder none(model_.get(), nullptr);
  absl::StatusOr<v1::GenerateRequest> g = ToGenerateRequest(r, none, model_->tokenizer(), &echo);
  EXPECT_EQ(g.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParamOf(g.status()), "messages");
  EXPECT_THAT(std::string(g.status().message()), HasSubstr("no chat template"));

  chat::ChatTemplateLimits limits;
  limits.max_in_flight = 1;
  std::unique_ptr<chat::ChatTemplate> t = Template(limits);
  absl::StatusOr<std::shared_ptr<void>> slot = t->HoldRenderSlotForTest();
  ASSERT_TRUE(slot.ok());
  PromptEncoder busy(model_.get(), std::move(t));
  g = ToGenerateRequest(r, busy, model_->tokenizer(), &echo);
  EXPECT_EQ(g.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(ParamOf(g.status()), "");
  EXPECT_EQ(ErrorFromStatus(g.status()).http_status, 503);
}

}  // namespace
}  // namespace pd::router::openai
