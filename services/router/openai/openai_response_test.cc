#include "services/router/openai/openai_response.h"

#include <limits>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace pd::router::openai {
namespace {

using json = nlohmann::json;
namespace v1 = pdserve::v1;

v1::GenerateResponse Msg(const std::string& text, v1::FinishReason finish = {}) {
  v1::GenerateResponse m;
  m.set_text(text);
  m.add_token_ids(1);
  if (finish != v1::FINISH_REASON_UNSPECIFIED) {
    m.set_finish_reason(finish);
    m.mutable_usage()->set_prompt_tokens(5);
    m.mutable_usage()->set_completion_tokens(3);
    m.mutable_usage()->set_cached_tokens(2);
  }
  return m;
}

// The JSON payloads of "data: ..." events, in order ("[DONE]" kept as a string).
std::vector<std::string> Events(const std::string& sse) {
  std::vector<std::string> out;
  for (absl::string_view e : absl::StrSplit(sse, "\n\n", absl::SkipEmpty())) {
    EXPECT_TRUE(absl::StartsWith(e, "data: ")) << e;
    out.emplace_back(e.substr(6));
  }
  return out;
}

OpenAiRequest Request(Endpoint endpoint, bool include_usage = false) {
  OpenAiRequest r;
  r.endpoint = endpoint;
  r.stream = true;
  r.include_usage = include_usage;
  return r;
}

TEST(OpenAiResponseTest, StatusMapsToHttpAndErrorObject) {
  struct Case {
    absl::Status status;
    int http;
    std::string type;
  };
  const std::vector<Case> cases = {
      {absl::InvalidArgumentError("bad"), 400, "invalid_request_error"},
      {absl::UnauthenticatedError("no key"), 401, "authentication_error"},
      {absl::PermissionDeniedError("x"), 403, "permission_error"},
      {absl::NotFoundError("unknown model 'x'"), 404, "invalid_request_error"},
      {absl::ResourceExhaustedError("full"), 429, "rate_limit_error"},
      {absl::UnavailableError("no worker"), 503, "service_unavailable_error"},
      {absl::DeadlineExceededError("late"), 504, "timeout_error"},
      {absl::InternalError("boom"), 500, "server_error"},
  };
  for (const Case& c : cases) {
    const ApiError e = ErrorFromStatus(c.status);
    EXPECT_EQ(e.http_status, c.http) << c.status;
    EXPECT_EQ(e.type, c.type) << c.status;
    const json body = json::parse(ErrorBody(e));
    EXPECT_EQ(body["error"]["message"], std::string(c.status.message()));
    EXPECT_EQ(body["error"]["type"], c.type);
    EXPECT_TRUE(body["error"].contains("param"));
    EXPECT_TRUE(body["error"].contains("code"));
  }
  const ApiError model = ErrorFromStatus(absl::NotFoundError("unknown model 'x'"));
  EXPECT_EQ(model.param, "model");
  EXPECT_EQ(model.code, "model_not_found");
  const ApiError field = ErrorFromStatus(WithParam(absl::InvalidArgumentError("t"), "top_p"));
  EXPECT_EQ(json::parse(ErrorBody(field))["error"]["param"], "top_p");
  EXPECT_TRUE(json::parse(ErrorBody(ErrorFromStatus(absl::InternalError("x"))))["error"]["param"]
                  .is_null());
}

TEST(OpenAiResponseTest, ChatStreamRoleContentFinishUsageDone) {
  ResponseBuilder b(Request(Endpoint::kChat, /*include_usage=*/true), "chatcmpl-1", 100, "m", "");
  std::string sse = b.StreamEvents(Msg("Hel"));
  sse += b.StreamEvents(Msg("lo", v1::FINISH_REASON_STOP));
  sse += ResponseBuilder::DoneEvent();
  const std::vector<std::string> ev = Events(sse);
  ASSERT_EQ(ev.size(), 6u);
  const json role = json::parse(ev[0]);
  EXPECT_EQ(role["object"], "chat.completion.chunk");
  EXPECT_EQ(role["id"], "chatcmpl-1");
  EXPECT_EQ(role["created"], 100);
  EXPECT_EQ(role["model"], "m");
  EXPECT_EQ(role["choices"][0]["delta"]["role"], "assistant");
  EXPECT_TRUE(role["usage"].is_null());
  EXPECT_EQ(json::parse(ev[1])["choices"][0]["delta"]["content"], "Hel");
  EXPECT_TRUE(json::parse(ev[1])["choices"][0]["finish_reason"].is_null());
  EXPECT_EQ(json::parse(ev[2])["choices"][0]["delta"]["content"], "lo");
  const json fin = json::parse(ev[3]);
  EXPECT_EQ(fin["choices"][0]["finish_reason"], "stop");
  EXPECT_TRUE(fin["choices"][0]["delta"].empty());
  const json usage = json::parse(ev[4]);
  EXPECT_TRUE(usage["choices"].empty());
  EXPECT_EQ(usage["usage"]["prompt_tokens"], 5);
  EXPECT_EQ(usage["usage"]["completion_tokens"], 3);
  EXPECT_EQ(usage["usage"]["total_tokens"], 8);
  EXPECT_EQ(usage["usage"]["prompt_tokens_details"]["cached_tokens"], 2);
  EXPECT_EQ(ev[5], "[DONE]");
}

TEST(OpenAiResponseTest, CompletionsStreamWithoutUsageHasNoUsageField) {
  ResponseBuilder b(Request(Endpoint::kCompletions), "cmpl-1", 1, "m", "");
  const std::vector<std::string> ev =
      Events(b.StreamEvents(Msg("a")) + b.StreamEvents(Msg("", v1::FINISH_REASON_LENGTH)));
  ASSERT_EQ(ev.size(), 2u);  // no role chunk; an empty text message adds no chunk
  const json first = json::parse(ev[0]);
  EXPECT_EQ(first["object"], "text_completion");
  EXPECT_EQ(first["choices"][0]["text"], "a");
  EXPECT_FALSE(first.contains("usage"));
  EXPECT_EQ(json::parse(ev[1])["choices"][0]["finish_reason"], "length");
}

TEST(OpenAiResponseTest, NonStreamingBodies) {
  OpenAiRequest chat = Request(Endpoint::kChat);
  chat.stream = false;
  ResponseBuilder c(chat, "chatcmpl-2", 7, "m", "");
  c.Add(Msg("Hi "));
  c.Add(Msg("there", v1::FINISH_REASON_STOP_STRING));
  ASSERT_TRUE(c.finished());
  const json body = json::parse(c.Body());
  EXPECT_EQ(body["object"], "chat.completion");
  EXPECT_EQ(body["choices"][0]["message"]["role"], "assistant");
  EXPECT_EQ(body["choices"][0]["message"]["content"], "Hi there");
  EXPECT_EQ(body["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(body["usage"]["total_tokens"], 8);

  OpenAiRequest comp = Request(Endpoint::kCompletions);
  comp.stream = false;
  ResponseBuilder e(comp, "cmpl-3", 7, "m", "Once");
  e.Add(Msg(" upon", v1::FINISH_REASON_LENGTH));
  const json echoed = json::parse(e.Body());
  EXPECT_EQ(echoed["object"], "text_completion");
  EXPECT_EQ(echoed["choices"][0]["text"], "Once upon");
  EXPECT_EQ(echoed["choices"][0]["finish_reason"], "length");
}

TEST(OpenAiResponseTest, ErrorEventIsOneDataLine) {
  const std::string ev =
      ResponseBuilder::ErrorEvent(ErrorFromStatus(absl::UnavailableError("worker died")));
  const std::vector<std::string> events = Events(ev);
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(json::parse(events[0])["error"]["message"], "worker died");
}


// Tokens 10, 11, 12 are "a", "\xC3" (half of "é") and "\xA9"; an alternative 99 is "zz".
std::string FakeBytes(uint32_t /*prev*/, uint32_t token) {
  switch (token) {
    case 10:
      return "a";
    case 11:
      return "\xC3";
    case 12:
      return "\xA9";
    default:
      return "zz";
  }
}

v1::GenerateResponse LogprobMsg(const std::vector<uint32_t>& tokens, const std::string& text,
                                v1::FinishReason finish = {}) {
  v1::GenerateResponse m;
  m.set_text(text);
  for (uint32_t t : tokens) {
    m.add_token_ids(t);
    v1::TokenLogprob* lp = m.add_logprobs();
    lp->set_logprob(-0.5f);
    v1::TopLogprob* top = lp->add_top();
    top->set_token_id(99);
    top->set_logprob(-std::numeric_limits<float>::infinity());
  }
  if (finish != v1::FINISH_REASON_UNSPECIFIED) {
    m.set_finish_reason(finish);
    m.mutable_usage()->set_completion_tokens(static_cast<uint32_t>(tokens.size()));
  }
  return m;
}

TEST(OpenAiResponseTest, ChatLogprobsNameTokensWithBytesAndClampMinusInfinity) {
  OpenAiRequest r = Request(Endpoint::kChat);
  r.stream = false;
  r.logprobs = 1;
  ResponseBuilder b(r, "chatcmpl-1", 7, "m", "", FakeBytes);
  b.Add(LogprobMsg({10, 11}, "a"));
  b.Add(LogprobMsg({12}, "\xC3\xA9", v1::FINISH_REASON_LENGTH));
  const json body = json::parse(b.Body());
  const json& content = body["choices"][0]["logprobs"]["content"];
  ASSERT_EQ(content.size(), 3u);
  EXPECT_EQ(content[0]["token"], "a");
  EXPECT_EQ(content[0]["logprob"], -0.5);
  EXPECT_EQ(content[0]["bytes"], json::array({97}));
  EXPECT_EQ(content[1]["bytes"], json::array({0xC3}));  // half a character: bytes say which
  EXPECT_EQ(content[1]["token"], "\xEF\xBF\xBD");        // and the string is U+FFFD
  ASSERT_EQ(content[2]["top_logprobs"].size(), 1u);
  EXPECT_EQ(content[2]["top_logprobs"][0]["token"], "zz");
  EXPECT_EQ(content[2]["top_logprobs"][0]["logprob"], -9999.0);
  EXPECT_TRUE(body["choices"][0]["logprobs"]["refusal"].is_null());
}

TEST(OpenAiResponseTest, CompletionLogprobsHaveOffsetsAfterTheEcho) {
  OpenAiRequest r = Request(Endpoint::kCompletions);
  r.stream = false;
  r.logprobs = 1;
  ResponseBuilder b(r, "cmpl-1", 7, "m", "h\xC3\xA9", FakeBytes);  // echo: 2 characters
  b.Add(LogprobMsg({10, 11, 12, 10}, "a\xC3\xA9" "a", v1::FINISH_REASON_STOP));
  const json lp = json::parse(b.Body())["choices"][0]["logprobs"];
  EXPECT_EQ(lp["tokens"].size(), 4u);
  EXPECT_EQ(lp["token_logprobs"][0], -0.5);
  EXPECT_EQ(lp["text_offset"], json::array({2, 3, 4, 4}));  // "\xA9" continues a character
  EXPECT_EQ(lp["top_logprobs"][0], json({{"zz", -9999.0}, {"a", -0.5}}));  // + sampled token
}

TEST(OpenAiResponseTest, StreamedLogprobsTravelWithTheirTokensEvenWithoutText) {
  OpenAiRequest r = Request(Endpoint::kChat);
  r.logprobs = 0;
  ResponseBuilder b(r, "chatcmpl-1", 7, "m", "", FakeBytes);
  std::vector<std::string> ev = Events(b.StreamEvents(LogprobMsg({11}, "")));  // held back
  ASSERT_EQ(ev.size(), 2u);  // role chunk, then the token's logprobs with empty content
  const json held = json::parse(ev[1]);
  EXPECT_EQ(held["choices"][0]["delta"]["content"], "");
  EXPECT_EQ(held["choices"][0]["logprobs"]["content"].size(), 1u);
  ev = Events(b.StreamEvents(LogprobMsg({12}, "\xC3\xA9", v1::FINISH_REASON_STOP)));
  ASSERT_EQ(ev.size(), 2u);  // text + its logprobs, then the finish chunk
  EXPECT_EQ(json::parse(ev[0])["choices"][0]["logprobs"]["content"][0]["bytes"],
            json::array({0xA9}));
  EXPECT_TRUE(json::parse(ev[1])["choices"][0]["logprobs"].is_null());
}

TEST(OpenAiResponseTest, NoLogprobsUnlessAsked) {
  OpenAiRequest r = Request(Endpoint::kCompletions);
  r.stream = false;
  ResponseBuilder b(r, "cmpl-1", 7, "m", "", FakeBytes);
  b.Add(LogprobMsg({10}, "a", v1::FINISH_REASON_STOP));
  EXPECT_TRUE(json::parse(b.Body())["choices"][0]["logprobs"].is_null());
}

}  // namespace
}  // namespace pd::router::openai
