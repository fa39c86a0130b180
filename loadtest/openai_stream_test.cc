#include "loadtest/openai_stream.h"

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pd::loadtest {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::vector<std::string> DecodeAll(const std::vector<std::string>& pieces) {
  SseDecoder d;
  std::vector<std::string> events;
  for (const std::string& p : pieces) {
    EXPECT_TRUE(d.Feed(p, [&](absl::string_view e) {
      events.emplace_back(e);
      return true;
    }));
  }
  return events;
}

TEST(SseDecoderTest, SplitAnywhereGivesTheSameEvents) {
  const std::string stream =
      "data: {\"a\":1}\r\n\r\n: keep-alive comment\n\ndata:{\"b\":2}\r\r"
      "event: message\nid: 7\ndata: line1\ndata: line2\n\ndata: [DONE]\n\n";
  const std::vector<std::string> want = {"{\"a\":1}", "{\"b\":2}", "line1\nline2", "[DONE]"};
  EXPECT_EQ(DecodeAll({stream}), want);
  for (size_t cut = 0; cut <= stream.size(); ++cut) {
    EXPECT_EQ(DecodeAll({stream.substr(0, cut), stream.substr(cut)}), want) << "cut " << cut;
  }
  std::vector<std::string> bytes;
  for (char c : stream) {
    bytes.emplace_back(1, c);
  }
  EXPECT_EQ(DecodeAll(bytes), want);
}

TEST(SseDecoderTest, EventsWithoutDataAndIncompleteEventsAreNotDispatched) {
  EXPECT_THAT(DecodeAll({"event: ping\n\n: only a comment\n\ndata: x\n\ndata: tail"}),
              ElementsAre("x"));
  EXPECT_THAT(DecodeAll({"data\n\n"}), ElementsAre(""));  // a field without colon: empty value
}

TEST(SseDecoderTest, StopsWhenTheCallbackSaysSo) {
  SseDecoder d;
  int calls = 0;
  EXPECT_FALSE(d.Feed("data: 1\n\ndata: 2\n\n", [&](absl::string_view) {
    ++calls;
    return false;
  }));
  EXPECT_EQ(calls, 1);
}

class RecorderTest : public ::testing::Test {
 protected:
  RequestRecord record_;
};

TEST_F(RecorderTest, ChatTtftIsTheFirstContentChunkNotTheRoleChunk) {
  OpenAiStreamRecorder r(OpenAiEndpoint::kChat, &record_);
  EXPECT_TRUE(
      r.OnData(R"({"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]})", 100));
  EXPECT_EQ(record_.first_token_ns, -1);
  EXPECT_TRUE(r.OnData(R"({"choices":[{"delta":{"content":"Hel"}}]})", 250));
  EXPECT_TRUE(r.OnData(R"({"choices":[{"delta":{"content":""}}]})", 300));  // no content
  EXPECT_TRUE(r.OnData(R"({"choices":[{"delta":{"content":"lo"}}]})", 400));
  EXPECT_TRUE(r.OnData(R"({"choices":[{"delta":{"content":"!"},"finish_reason":"length"}]})", 450));
  EXPECT_TRUE(r.OnData(R"({"choices":[],"usage":{"prompt_tokens":12,"completion_tokens":5,)"
                       R"("prompt_tokens_details":{"cached_tokens":8}}})",
                       460));
  EXPECT_FALSE(r.OnData("[DONE]", 470));
  EXPECT_TRUE(r.done());
  r.Finish(480, absl::OkStatus());
  EXPECT_EQ(record_.code, absl::StatusCode::kOk) << record_.error;
  EXPECT_EQ(record_.first_token_ns, 250);
  EXPECT_THAT(record_.itl_ns, ElementsAre(150, 50));  // one sample per content chunk
  EXPECT_EQ(record_.finish_reason, "LENGTH");
  EXPECT_TRUE(record_.has_usage);
  EXPECT_EQ(record_.prompt_tokens, 12);
  EXPECT_EQ(record_.cached_tokens, 8);
  EXPECT_EQ(record_.completion_tokens, 5);
  EXPECT_EQ(record_.output_tokens, 5);  // from usage, not the 3 chunks
  EXPECT_EQ(r.content_chunks(), 3);
  EXPECT_EQ(record_.end_ns, 480);
}

TEST_F(RecorderTest, CompletionsTextAndNoUsage) {
  OpenAiStreamRecorder r(OpenAiEndpoint::kCompletions, &record_);
  EXPECT_TRUE(r.OnData(R"({"choices":[{"text":"a"}]})", 10));
  EXPECT_TRUE(r.OnData(R"({"choices":[{"text":"b","finish_reason":"stop"}]})", 30));
  r.Finish(40, absl::OkStatus());
  EXPECT_TRUE(record_.ok());
  EXPECT_EQ(record_.first_token_ns, 10);
  EXPECT_THAT(record_.itl_ns, ElementsAre(20));
  EXPECT_FALSE(record_.has_usage);
  EXPECT_EQ(record_.output_tokens, 2);  // content chunks
  EXPECT_EQ(record_.finish_reason, "STOP");
}

TEST_F(RecorderTest, ErrorPayloadCarriesItsCode) {
  OpenAiStreamRecorder r(OpenAiEndpoint::kCompletions, &record_);
  EXPECT_TRUE(r.OnData(R"({"choices":[{"text":"a"}]})", 10));
  EXPECT_FALSE(r.OnData(
      R"({"error":{"message":"too many requests","type":"rate_limit_error","code":429}})", 20));
  r.Finish(30, absl::UnavailableError("connection closed"));  // the payload's error wins
  EXPECT_EQ(record_.code, absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(record_.error, "too many requests");
}

TEST_F(RecorderTest, MalformedJsonIsInternal) {
  OpenAiStreamRecorder r(OpenAiEndpoint::kChat, &record_);
  EXPECT_FALSE(r.OnData("{\"choices\": [", 5));
  r.Finish(6, absl::OkStatus());
  EXPECT_EQ(record_.code, absl::StatusCode::kInternal);
  EXPECT_THAT(record_.error, HasSubstr("malformed JSON"));
}

TEST_F(RecorderTest, StreamWithoutFinishReasonIsInternalAndTransportErrorsWin) {
  {
    OpenAiStreamRecorder r(OpenAiEndpoint::kCompletions, &record_);
    EXPECT_TRUE(r.OnData(R"({"choices":[{"text":"a"}]})", 10));
    r.Finish(20, absl::OkStatus());
    EXPECT_EQ(record_.code, absl::StatusCode::kInternal);
    EXPECT_THAT(record_.error, HasSubstr("without a finish reason"));
  }
  RequestRecord other;
  OpenAiStreamRecorder r(OpenAiEndpoint::kCompletions, &other);
  r.Finish(20, absl::UnavailableError("http://x: Connection"));
  EXPECT_EQ(other.code, absl::StatusCode::kUnavailable);
  EXPECT_EQ(other.end_ns, 20);
}

TEST(HttpErrorTest, StatusCodesAndMessages) {
  EXPECT_EQ(HttpStatusToCode(400), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(HttpStatusToCode(401), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(HttpStatusToCode(404), absl::StatusCode::kNotFound);
  EXPECT_EQ(HttpStatusToCode(429), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(HttpStatusToCode(500), absl::StatusCode::kInternal);
  EXPECT_EQ(HttpStatusToCode(503), absl::StatusCode::kUnavailable);
  EXPECT_EQ(HttpStatusToCode(418), absl::StatusCode::kFailedPrecondition);
  const absl::Status s = HttpErrorStatus(
      429,
      R"({"error":{"message":"slow down","type":"rate_limit_error","param":null,"code":null}})");
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(s.message(), "HTTP 429: slow down");
  EXPECT_EQ(HttpErrorStatus(400, R"({"object":"error","message":"bad","code":400})").message(),
            "HTTP 400: bad");
  EXPECT_EQ(HttpErrorStatus(500, "Internal Server Error\n").message(),
            "HTTP 500: Internal Server Error");
  EXPECT_EQ(HttpErrorStatus(502, "").message(), "HTTP 502");
}

TEST(OpenAiRequestBodyTest, CompletionsSendsTokenIdsAndTheExtensions) {
  const std::vector<uint32_t> ids = {5, 6, 7};
  OpenAiRequestFields f;
  f.model = "m";
  f.prompt_ids = ids;
  f.max_tokens = 9;
  f.cache_salt = "s";
  const nlohmann::json j = nlohmann::json::parse(OpenAiRequestBody(f));
  EXPECT_EQ(j["model"], "m");
  EXPECT_EQ(j["prompt"], nlohmann::json({5, 6, 7}));
  EXPECT_EQ(j["max_tokens"], 9);
  EXPECT_EQ(j["temperature"], 0.0);
  EXPECT_EQ(j["stream"], true);
  EXPECT_EQ(j["stream_options"]["include_usage"], true);
  EXPECT_EQ(j["ignore_eos"], true);
  EXPECT_EQ(j["cache_salt"], "s");
  EXPECT_FALSE(j.contains("messages"));
}

TEST(OpenAiRequestBodyTest, ChatSendsOneUserMessageWithInvalidUtf8Replaced) {
  OpenAiRequestFields f;
  f.endpoint = OpenAiEndpoint::kChat;
  f.model = "m";
  const std::string text = "hi \xff there";
  f.prompt_text = text;
  f.ignore_eos = false;
  const nlohmann::json j = nlohmann::json::parse(OpenAiRequestBody(f));
  ASSERT_EQ(j["messages"].size(), 1u);
  EXPECT_EQ(j["messages"][0]["role"], "user");
  EXPECT_EQ(j["messages"][0]["content"], "hi \xEF\xBF\xBD there");
  EXPECT_FALSE(j.contains("ignore_eos"));
  EXPECT_FALSE(j.contains("cache_salt"));
  EXPECT_FALSE(j.contains("prompt"));
}

TEST(OpenAiRequestBodyTest, JsonSchemaIsSentAsResponseFormat) {
  OpenAiRequestFields f;
  f.model = "m";
  f.ignore_eos = false;
  f.penalties.presence_penalty = 0.5;
  f.penalties.repetition_penalty = 1.2;
  f.json_schema = R"({"type":"array","items":{"type":"string"}})";
  const nlohmann::json j = nlohmann::json::parse(OpenAiRequestBody(f));
  EXPECT_EQ(j["presence_penalty"], 0.5);
  EXPECT_EQ(j["repetition_penalty"], 1.2);
  EXPECT_FALSE(j.contains("frequency_penalty"));  // zero: unset, not sent
  EXPECT_FALSE(j.contains("min_p"));
  EXPECT_EQ(j["response_format"]["type"], "json_schema");
  EXPECT_EQ(j["response_format"]["json_schema"]["name"], "loadtest");
  EXPECT_EQ(j["response_format"]["json_schema"]["schema"]["items"]["type"], "string");
  EXPECT_FALSE(j.contains("ignore_eos"));
}

TEST(OpenAiUrlTest, BaseUrlsWithAndWithoutV1) {
  struct Case {
    const char* url;
    const char* origin;
    const char* root;
  } cases[] = {{"http://127.0.0.1:8000", "http://127.0.0.1:8000", "/v1"},
               {"http://127.0.0.1:8000/", "http://127.0.0.1:8000", "/v1"},
               {"http://127.0.0.1:8000/v1", "http://127.0.0.1:8000", "/v1"},
               {"http://h:1/v1/", "http://h:1", "/v1"},
               {"https://api.example.com/openai", "https://api.example.com", "/openai/v1"}};
  for (const Case& c : cases) {
    absl::StatusOr<OpenAiUrl> u = ParseOpenAiUrl("target", c.url);
    ASSERT_TRUE(u.ok()) << c.url << ": " << u.status();
    EXPECT_EQ(u->origin, c.origin) << c.url;
    EXPECT_EQ(u->api_root, c.root) << c.url;
  }
  for (const char* bad : {"127.0.0.1:8000", "ftp://h/v1", "http://", "http:///v1"}) {
    absl::StatusOr<OpenAiUrl> u = ParseOpenAiUrl("target", bad);
    EXPECT_EQ(u.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(u.status().message(), HasSubstr("--target")) << bad;
  }
}

TEST(OpenAiEndpointTest, Names) {
  EXPECT_EQ(*ParseOpenAiEndpoint("endpoint", "chat"), OpenAiEndpoint::kChat);
  EXPECT_EQ(*ParseOpenAiEndpoint("endpoint", "completions"), OpenAiEndpoint::kCompletions);
  EXPECT_EQ(ParseOpenAiEndpoint("endpoint", "embeddings").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(OpenAiEndpointPath(OpenAiEndpoint::kChat), "/chat/completions");
}

TEST(ModelListTest, ParsesIdsAndMaxModelLen) {
  absl::StatusOr<std::vector<OpenAiModel>> m =
      ParseModelList(R"({"object":"list","data":[{"id":"a","max_model_len":2048},{"id":"b"}]})");
  ASSERT_TRUE(m.ok()) << m.status();
  ASSERT_EQ(m->size(), 2u);
  EXPECT_EQ((*m)[0].id, "a");
  EXPECT_EQ((*m)[0].max_model_len, 2048);
  EXPECT_EQ((*m)[1].max_model_len, 0);
  EXPECT_FALSE(ParseModelList("[]").ok());
  EXPECT_FALSE(ParseModelList(R"({"data":[{"name":"x"}]})").ok());
}

}  // namespace
}  // namespace pd::loadtest
