// HttpStream between a scripted fake stream (a StreamControl that plays messages into the
// stream's sink in lockstep, as RouterStream does) and a fake event writer: what reaches the
// client, and that every message is acknowledged exactly once, whatever happens to the client.
#include "services/router/openai/http_stream.h"

#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "services/router/openai/http_stream_test_util.h"

namespace pd::router::openai {
namespace {

namespace v1 = pdserve::v1;

using ::testing::ElementsAre;
using ::testing::HasSubstr;

OpenAiRequest Request(bool stream) {
  absl::StatusOr<OpenAiRequest> r = ParseRequest(
      Endpoint::kCompletions,
      stream ? R"({"model":"m","prompt":"hi","stream":true})" : R"({"model":"m","prompt":"hi"})",
      ParseLimits());
  EXPECT_TRUE(r.ok()) << r.status();
  return *r;
}

class HttpStreamTest : public ::testing::Test {
 protected:
  // A stream of `messages` then `status`, attached and started.
  std::unique_ptr<HttpStream> Make(std::vector<v1::GenerateResponse> messages,
                                   absl::Status status = absl::OkStatus(), bool hold = false) {
    HttpStreamOptions options;
    options.client_check = absl::Milliseconds(1);
    options.ping = absl::Milliseconds(1);
    options.client_gone = [this] { return client_gone_; };
    auto st = std::make_unique<HttpStream>(&live_, std::move(options));
    auto script = std::make_unique<ScriptedStream>(st->sink(), std::move(messages),
                                                   std::move(status), &acks_, &cancels_);
    ScriptedStream* started = script.get();
    st->Attach(std::move(script));
    started->Start(hold);
    return st;
  }

  // Takes the first message of `st` and starts its event stream.
  static void StartStream(HttpStream& st) {
    v1::GenerateResponse first;
    ASSERT_TRUE(st.WaitFirst(&first).ok());
    st.SetBuilder(ResponseBuilder(Request(true), "cmpl-r1", 0, "m", ""));
    st.StartEvents(first);
  }

  // WriteEvents until the response is done or a write fails.
  static void Drive(HttpStream& st, FakeWriter& out) {
    for (int i = 0; i < 100 && !out.done; ++i) {
      if (!st.WriteEvents(out)) return;
    }
  }

  LiveStreams live_;
  std::vector<bool> acks_;
  int cancels_ = 0;
  bool client_gone_ = false;
};

TEST_F(HttpStreamTest, StreamWritesEveryMessageThenDoneAndAcknowledgesEach) {
  std::unique_ptr<HttpStream> st = Make({Msg("Once"), Msg(" upon"), Msg(" a", true)});
  ASSERT_NO_FATAL_FAILURE(StartStream(*st));
  FakeWriter out;
  Drive(*st, out);
  EXPECT_TRUE(out.done);
  EXPECT_THAT(out.out, HasSubstr("\"Once\""));
  EXPECT_THAT(out.out, HasSubstr("\" upon\""));
  EXPECT_THAT(out.out, HasSubstr("\"finish_reason\":\"length\""));
  EXPECT_TRUE(absl::EndsWith(out.out, "data: [DONE]\n\n")) << out.out;
  EXPECT_LT(out.out.find("Once"), out.out.find(" upon"));
  EXPECT_THAT(acks_, ElementsAre(true, true, true));
  st.reset();
  EXPECT_EQ(cancels_, 0);
}

TEST_F(HttpStreamTest, StreamFailingAfterOutputEndsWithAnErrorEventThenDone) {
  std::unique_ptr<HttpStream> st =
      Make({Msg("Once")}, absl::UnavailableError("decode worker failed: gone (retry)"));
  ASSERT_NO_FATAL_FAILURE(StartStream(*st));
  FakeWriter out;
  Drive(*st, out);
  EXPECT_TRUE(out.done);
  const size_t error = out.out.find("\"error\"");
  ASSERT_NE(error, std::string::npos) << out.out;
  EXPECT_THAT(out.out, HasSubstr("decode worker failed: gone (retry)"));
  EXPECT_LT(error, out.out.find("data: [DONE]"));
  EXPECT_THAT(acks_, ElementsAre(true));
}

// A client that stops reading: the failed write acknowledges the message as not sent (the
// generation is cancelled), and destroying the stream waits for its end without hanging.
TEST_F(HttpStreamTest, FailedWriteAcknowledgesNotSentAndEndsTheGeneration) {
  std::unique_ptr<HttpStream> st = Make({Msg("Once"), Msg(" upon"), Msg(" a", true)});
  ASSERT_NO_FATAL_FAILURE(StartStream(*st));
  FakeWriter out;
  out.fail_at = 2;
  Drive(*st, out);
  EXPECT_FALSE(out.done);
  EXPECT_THAT(acks_, ElementsAre(true, false));
  st.reset();
  EXPECT_THAT(acks_, ElementsAre(true, false));  // nothing acknowledged twice
}

// Nothing to say for a while: a ping comment (a client that stopped reading is noticed by
// its failed write).
TEST_F(HttpStreamTest, IdleStreamPingsAndIsCancelledWhenDestroyed) {
  std::unique_ptr<HttpStream> st = Make({}, absl::OkStatus(), /*hold=*/true);
  st->SetBuilder(ResponseBuilder(Request(true), "cmpl-r1", 0, "m", ""));
  FakeWriter out;
  ASSERT_TRUE(st->WriteEvents(out));
  EXPECT_EQ(out.out, ": ping\n\n");
  EXPECT_FALSE(out.done);
  st.reset();  // cancels the generation and waits for its end
  EXPECT_EQ(cancels_, 1);
  EXPECT_TRUE(acks_.empty());
}

// The client went away between the first message and its write: the message is acknowledged
// as not sent when the stream is destroyed.
TEST_F(HttpStreamTest, FirstMessageNeverWrittenIsAcknowledgedNotSent) {
  std::unique_ptr<HttpStream> st = Make({Msg("Once"), Msg(" upon", true)});
  v1::GenerateResponse first;
  ASSERT_TRUE(st->WaitFirst(&first).ok());
  st.reset();
  EXPECT_THAT(acks_, ElementsAre(false));
}

TEST_F(HttpStreamTest, EndBeforeAnyOutputIsTheAnswer) {
  std::unique_ptr<HttpStream> st = Make({}, absl::ResourceExhaustedError("no kv blocks"));
  v1::GenerateResponse first;
  const absl::Status s = st->WaitFirst(&first);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(s.message(), "no kv blocks");

  std::unique_ptr<HttpStream> empty = Make({}, absl::OkStatus());
  EXPECT_EQ(empty->WaitFirst(&first).code(), absl::StatusCode::kInternal);
}

// A client that hangs up before the first token cancels its generation.
TEST_F(HttpStreamTest, ClientGoneBeforeTheFirstMessageCancels) {
  client_gone_ = true;
  std::unique_ptr<HttpStream> st = Make({}, absl::OkStatus(), /*hold=*/true);
  v1::GenerateResponse first;
  EXPECT_EQ(st->WaitFirst(&first).code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(cancels_, 1);
  st.reset();
  EXPECT_EQ(cancels_, 1);  // it had ended already
}

TEST_F(HttpStreamTest, BodyCollectsEveryMessage) {
  std::unique_ptr<HttpStream> st = Make({Msg("Once"), Msg(" upon"), Msg(" a", true)});
  v1::GenerateResponse first;
  ASSERT_TRUE(st->WaitFirst(&first).ok());
  st->SetBuilder(ResponseBuilder(Request(false), "cmpl-r1", 0, "m", ""));
  absl::StatusOr<std::string> body = st->ReadBody(first);
  ASSERT_TRUE(body.ok()) << body.status();
  EXPECT_THAT(*body, HasSubstr("Once upon a"));
  EXPECT_THAT(acks_, ElementsAre(true, true, true));
}

TEST_F(HttpStreamTest, BodyOfAFailedStreamIsItsError) {
  std::unique_ptr<HttpStream> st = Make({Msg("Once")}, absl::DeadlineExceededError("late"));
  v1::GenerateResponse first;
  ASSERT_TRUE(st->WaitFirst(&first).ok());
  st->SetBuilder(ResponseBuilder(Request(false), "cmpl-r1", 0, "m", ""));
  EXPECT_EQ(st->ReadBody(first).status().code(), absl::StatusCode::kDeadlineExceeded);
}

TEST_F(HttpStreamTest, LiveStreamsCancelsEveryStreamAndWaitsForNone) {
  std::unique_ptr<HttpStream> a = Make({}, absl::OkStatus(), /*hold=*/true);
  std::unique_ptr<HttpStream> b = Make({}, absl::OkStatus(), /*hold=*/true);
  live_.CancelAll();
  EXPECT_EQ(cancels_, 2);
  a.reset();
  b.reset();
  const int after = cancels_;
  live_.CancelAll();  // the destroyed streams left the set
  EXPECT_EQ(cancels_, after);
  live_.WaitIdle(absl::InfiniteFuture());  // returns: nothing runs
}

}  // namespace
}  // namespace pd::router::openai
