// SiblingStreams (the choices of n > 1) between scripted fake streams and a fake event writer:
// one body with every choice, one event stream with each choice's chunks under its index, one
// usage chunk and one [DONE] at the end, a failed choice failing the response, every message
// acknowledged exactly once.
#include "services/router/openai/sibling_streams.h"

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "services/router/openai/http_stream_test_util.h"

namespace pd::router::openai {
namespace {

namespace v1 = pdserve::v1;

using ::testing::Each;
using ::testing::HasSubstr;
using json = nlohmann::json;

OpenAiRequest Request(const std::string& body) {
  absl::StatusOr<OpenAiRequest> r = ParseRequest(Endpoint::kCompletions, body, ParseLimits());
  EXPECT_TRUE(r.ok()) << r.status();
  return *r;
}

v1::GenerateResponse Final(const std::string& text, uint32_t completion_tokens) {
  v1::GenerateResponse m = Msg(text, true);
  m.mutable_usage()->set_completion_tokens(completion_tokens);
  return m;
}

class SiblingStreamsTest : public ::testing::Test {
 protected:
  // One choice per script (messages then status), started, first messages taken.
  std::unique_ptr<SiblingStreams> Make(const OpenAiRequest& r,
                                       std::vector<std::vector<v1::GenerateResponse>> scripts,
                                       std::vector<absl::Status> statuses,
                                       std::vector<v1::GenerateResponse>* firsts) {
    auto doorbell = std::make_unique<Doorbell>();
    HttpStreamOptions options;
    options.client_check = absl::Milliseconds(1);
    options.ping = absl::Milliseconds(1);
    options.client_gone = [this] { return client_gone_; };
    options.doorbell = doorbell.get();
    std::vector<std::unique_ptr<HttpStream>> streams;
    firsts->resize(scripts.size());
    for (size_t i = 0; i < scripts.size(); ++i) {
      auto st = std::make_unique<HttpStream>(&live_, options);
      auto script = std::make_unique<ScriptedStream>(st->sink(), std::move(scripts[i]), statuses[i],
                                                     &acks_, &cancels_);
      ScriptedStream* started = script.get();
      st->Attach(std::move(script));
      started->Start();
      EXPECT_TRUE(st->WaitFirst(&(*firsts)[i]).ok());
      st->SetBuilder(ResponseBuilder(r, "cmpl-r1", 0, "m", ""));
      streams.push_back(std::move(st));
    }
    return std::make_unique<SiblingStreams>(std::move(doorbell), std::move(streams), options);
  }

  LiveStreams live_;
  std::vector<bool> acks_;
  int cancels_ = 0;
  bool client_gone_ = false;
};

TEST_F(SiblingStreamsTest, BodyHoldsEveryChoiceByIndexAndUsageCountsThePromptOnce) {
  const OpenAiRequest r = Request(R"({"model":"m","prompt":"hi","n":3})");
  std::vector<v1::GenerateResponse> firsts;
  std::unique_ptr<SiblingStreams> s =
      Make(r, {{Msg("A"), Final("a", 2)}, {Msg("B"), Msg("b"), Final("!", 3)}, {Final("C", 1)}},
           {absl::OkStatus(), absl::OkStatus(), absl::OkStatus()}, &firsts);
  absl::StatusOr<std::string> body = s->ReadBody(firsts);
  ASSERT_TRUE(body.ok()) << body.status();
  const json j = json::parse(*body);
  ASSERT_EQ(j["choices"].size(), 3u) << *body;
  EXPECT_EQ(j["choices"][0]["index"], 0);
  EXPECT_EQ(j["choices"][0]["text"], "Aa");
  EXPECT_EQ(j["choices"][1]["index"], 1);
  EXPECT_EQ(j["choices"][1]["text"], "Bb!");
  EXPECT_EQ(j["choices"][2]["index"], 2);
  EXPECT_EQ(j["choices"][2]["text"], "C");
  EXPECT_EQ(j["usage"]["prompt_tokens"], 3);
  EXPECT_EQ(j["usage"]["completion_tokens"], 6);
  EXPECT_EQ(j["usage"]["total_tokens"], 9);
  EXPECT_EQ(acks_.size(), 6u);
  EXPECT_THAT(acks_, Each(true));
}

TEST_F(SiblingStreamsTest, OneFailedChoiceFailsTheBodyAndCancelsTheOthers) {
  const OpenAiRequest r = Request(R"({"model":"m","prompt":"hi","n":2})");
  std::vector<v1::GenerateResponse> firsts;
  std::unique_ptr<SiblingStreams> s =
      Make(r, {{Msg("A"), Msg("a"), Msg("a"), Final("a", 4)}, {Msg("B")}},
           {absl::OkStatus(), absl::UnavailableError("no decode worker left")}, &firsts);
  absl::StatusOr<std::string> body = s->ReadBody(firsts);
  EXPECT_TRUE(absl::IsUnavailable(body.status())) << body.status();
  s.reset();  // the remaining choice is cancelled and waited for; nothing hangs
}

TEST_F(SiblingStreamsTest, StreamInterleavesChoicesByIndexThenOneUsageChunkAndOneDone) {
  const OpenAiRequest r = Request(R"({"model":"m","prompt":"hi","n":2,"stream":true,
                  "stream_options":{"include_usage":true}})");
  std::vector<v1::GenerateResponse> firsts;
  std::unique_ptr<SiblingStreams> s =
      Make(r, {{Msg("A0"), Msg("A1"), Final("A2", 3)}, {Msg("B0"), Final("B1", 2)}},
           {absl::OkStatus(), absl::OkStatus()}, &firsts);
  s->StartEvents(firsts);
  FakeWriter out;
  for (int i = 0; i < 200 && !out.done; ++i) {
    if (!s->WriteEvents(out)) break;
  }
  ASSERT_TRUE(out.done) << out.out;
  // Every data event parsed: texts per index, in order; one usage chunk, last before [DONE].
  std::vector<std::string> text(2);
  std::vector<int> finishes(2, 0);
  int usage_chunks = 0;
  size_t pos = 0;
  std::vector<std::string> events;
  while ((pos = out.out.find("data: ", pos)) != std::string::npos) {
    const size_t end = out.out.find("\n\n", pos);
    events.push_back(out.out.substr(pos + 6, end - pos - 6));
    pos = end;
  }
  ASSERT_GE(events.size(), 2u);
  EXPECT_EQ(events.back(), "[DONE]");
  for (size_t e = 0; e + 1 < events.size(); ++e) {
    const json j = json::parse(events[e]);
    if (j["choices"].empty()) {
      ++usage_chunks;
      EXPECT_EQ(e, events.size() - 2) << "the usage chunk comes last";
      EXPECT_EQ(j["usage"]["prompt_tokens"], 3);
      EXPECT_EQ(j["usage"]["completion_tokens"], 5);
      continue;
    }
    const json& c = j["choices"][0];
    const int index = c["index"].get<int>();
    ASSERT_TRUE(index == 0 || index == 1) << events[e];
    text[static_cast<size_t>(index)] += c["text"].get<std::string>();
    if (!c["finish_reason"].is_null()) ++finishes[static_cast<size_t>(index)];
  }
  EXPECT_EQ(text[0], "A0A1A2");
  EXPECT_EQ(text[1], "B0B1");
  EXPECT_EQ(finishes[0], 1);
  EXPECT_EQ(finishes[1], 1);
  EXPECT_EQ(usage_chunks, 1);
  EXPECT_EQ(acks_.size(), 5u);
  EXPECT_THAT(acks_, Each(true));
}

TEST_F(SiblingStreamsTest, StreamedChoiceFailingEndsWithAnErrorEventThenDone) {
  const OpenAiRequest r = Request(R"({"model":"m","prompt":"hi","n":2,"stream":true})");
  std::vector<v1::GenerateResponse> firsts;
  std::unique_ptr<SiblingStreams> s =
      Make(r, {{Msg("A0"), Msg("A1"), Msg("A2"), Final("A3", 4)}, {Msg("B0")}},
           {absl::OkStatus(), absl::UnavailableError("decode worker failed (retry)")}, &firsts);
  s->StartEvents(firsts);
  FakeWriter out;
  for (int i = 0; i < 200 && !out.done; ++i) {
    if (!s->WriteEvents(out)) break;
  }
  ASSERT_TRUE(out.done) << out.out;
  EXPECT_THAT(out.out, HasSubstr("decode worker failed (retry)"));
  EXPECT_TRUE(absl::EndsWith(out.out, "data: [DONE]\n\n")) << out.out;
  EXPECT_EQ(out.out.find("data: [DONE]"), out.out.rfind("data: [DONE]"));
  s.reset();
}

// A client that stops reading: the failed write cancels every choice; nothing hangs.
TEST_F(SiblingStreamsTest, FailedWriteCancelsEveryChoice) {
  const OpenAiRequest r = Request(R"({"model":"m","prompt":"hi","n":2,"stream":true})");
  std::vector<v1::GenerateResponse> firsts;
  std::unique_ptr<SiblingStreams> s =
      Make(r, {{Msg("A0"), Msg("A1"), Final("A2", 3)}, {Msg("B0"), Msg("B1"), Final("B2", 3)}},
           {absl::OkStatus(), absl::OkStatus()}, &firsts);
  s->StartEvents(firsts);
  FakeWriter out;
  out.fail_at = 2;
  bool ok = true;
  for (int i = 0; i < 200 && ok && !out.done; ++i) ok = s->WriteEvents(out);
  EXPECT_FALSE(ok);
  EXPECT_FALSE(out.done);
  EXPECT_EQ(cancels_, 2);  // at the failed write, not only when destroyed
  s.reset();
}

// A client that hangs up during a non-streamed request of several choices cancels them all.
TEST_F(SiblingStreamsTest, ClientGoneDuringBodyCancelsEveryChoice) {
  const OpenAiRequest r = Request(R"({"model":"m","prompt":"hi","n":2})");
  auto doorbell = std::make_unique<Doorbell>();
  HttpStreamOptions options;
  options.client_check = absl::Milliseconds(1);
  options.client_gone = [this] { return client_gone_; };
  options.doorbell = doorbell.get();
  std::vector<std::unique_ptr<HttpStream>> streams;
  std::vector<v1::GenerateResponse> firsts(2);
  for (size_t i = 0; i < 2; ++i) {
    auto st = std::make_unique<HttpStream>(&live_, options);
    auto script = std::make_unique<ScriptedStream>(st->sink(), std::vector{Msg("x"), Final("y", 2)},
                                                   absl::OkStatus(), &acks_, &cancels_);
    ScriptedStream* started = script.get();
    st->Attach(std::move(script));
    started->Start();
    started->set_hold(true);  // after the first message, nothing until cancelled
    ASSERT_TRUE(st->WaitFirst(&firsts[i]).ok());
    st->SetBuilder(ResponseBuilder(r, "cmpl-r1", 0, "m", ""));
    streams.push_back(std::move(st));
  }
  SiblingStreams s(std::move(doorbell), std::move(streams), options);
  client_gone_ = true;
  absl::StatusOr<std::string> body = s.ReadBody(firsts);
  EXPECT_TRUE(absl::IsCancelled(body.status())) << body.status();
  EXPECT_EQ(cancels_, 2);
}

}  // namespace
}  // namespace pd::router::openai
