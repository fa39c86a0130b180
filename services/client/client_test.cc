#include "services/client/client.h"

#include <atomic>
#include <nlohmann/json.hpp>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pd::client {
namespace {

using ::testing::HasSubstr;

// A router stand-in on 127.0.0.1 (port 0): Generate streams "Once", " upon", " a" and then ends
// as `mode` says; ListModels lists a model once `serving_model` is set.
class FakeRouter final : public pdserve::v1::Generation::Service {
 public:
  enum class Mode { kOk, kFailAfterFirst, kUntilCancelled };
  std::atomic<Mode> mode{Mode::kOk};
  std::atomic<bool> serving_model{true};
  absl::Notification first_sent;

  grpc::Status Generate(grpc::ServerContext* context, const pdserve::v1::GenerateRequest* request,
                        grpc::ServerWriter<pdserve::v1::GenerateResponse>* writer) override {
    const char* const words[] = {"Once", " upon", " a"};
    for (int i = 0; i < 3; ++i) {
      pdserve::v1::GenerateResponse r;
      r.add_token_ids(400 + i);
      r.set_text(words[i]);
      if (i == 0) {
        r.set_request_id("r-1");
      }
      writer->Write(r);
      if (i == 0 && !first_sent.HasBeenNotified()) {
        first_sent.Notify();
      }
      if (mode == Mode::kFailAfterFirst) {
        return grpc::Status(grpc::StatusCode::UNAVAILABLE, "decode worker died");
      }
      if (mode == Mode::kUntilCancelled) {
        // Bounded: a client that never cancels gets DEADLINE_EXCEEDED after 10 s, and the test
        // fails on the code instead of hanging.
        const absl::Time give_up = absl::Now() + absl::Seconds(10);
        while (!context->IsCancelled()) {
          if (absl::Now() > give_up) {
            return grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "never cancelled");
          }
          absl::SleepFor(absl::Milliseconds(5));
        }
        return grpc::Status::CANCELLED;
      }
    }
    pdserve::v1::GenerateResponse last;
    last.set_finish_reason(pdserve::v1::FINISH_REASON_LENGTH);
    last.set_request_id("r-1");
    last.mutable_usage()->set_prompt_tokens(request->token_ids().ids_size());
    last.mutable_usage()->set_completion_tokens(3);
    last.mutable_timings()->set_total_us(1500);
    writer->Write(last);
    return grpc::Status::OK;
  }

  grpc::Status ListModels(grpc::ServerContext*, const pdserve::v1::ListModelsRequest*,
                          pdserve::v1::ListModelsResponse* response) override {
    if (serving_model) {
      pdserve::v1::ModelInfo* m = response->add_models();
      m->set_id("stories260K");
      m->set_block_size(16);
      m->set_max_context_tokens(512);
      m->set_vocab_size(512);
      m->set_fingerprint("ab12");
    }
    return grpc::Status::OK;
  }
};

class ClientTest : public ::testing::Test {
 protected:
  void SetUp() override {
    grpc::EnableDefaultHealthCheckService(true);
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    builder.RegisterService(&router_);
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    channel_ = Connect(absl::StrCat("127.0.0.1:", port_));
    api_ = pdserve::v1::Generation::NewStub(channel_);
  }
  void TearDown() override { server_->Shutdown(absl::ToChronoTime(absl::Now())); }

  StreamSummary Stream(grpc::ClientContext* ctx, std::string* text) {
    pdserve::v1::GenerateRequest req;
    req.mutable_token_ids()->add_ids(1);
    return StreamGenerate(
        api_.get(), ctx, req,
        [text](const pdserve::v1::GenerateResponse& r, absl::Duration) { *text += r.text(); });
  }

  FakeRouter router_;
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<pdserve::v1::Generation::Stub> api_;
};

TEST_F(ClientTest, StreamsEveryMessageAndSummarizesTheLast) {
  grpc::ClientContext ctx;
  std::string text;
  StreamSummary s = Stream(&ctx, &text);
  ASSERT_TRUE(s.status.ok()) << s.status.error_message();
  EXPECT_EQ(text, "Once upon a");
  EXPECT_EQ(s.messages, 4);
  EXPECT_EQ(s.tokens, 3u);
  EXPECT_EQ(s.request_id, "r-1");
  ASSERT_TRUE(s.ttft.has_value());
  EXPECT_LE(*s.ttft, s.total);
  EXPECT_EQ(s.last.finish_reason(), pdserve::v1::FINISH_REASON_LENGTH);
  const std::string stats = FormatStats(s);
  EXPECT_THAT(stats, HasSubstr("prompt_tokens=1 cached_tokens=0 generated_tokens=3 ttft="));
  EXPECT_THAT(stats, HasSubstr("finish_reason=LENGTH request_id=r-1"));
  EXPECT_THAT(stats, HasSubstr("total=1.5ms)"));
}

TEST_F(ClientTest, ErrorStatusEndsTheStreamWithItsCodeName) {
  router_.mode = FakeRouter::Mode::kFailAfterFirst;
  grpc::ClientContext ctx;
  std::string text;
  StreamSummary s = Stream(&ctx, &text);
  EXPECT_EQ(s.status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(FormatRpcError(s.status), "UNAVAILABLE: decode worker died");
  EXPECT_EQ(text, "Once");
  EXPECT_THAT(FormatStats(s), HasSubstr("generated_tokens=1 ttft="));
}

TEST_F(ClientTest, TryCancelFromAnotherThreadEndsTheStreamCancelled) {
  router_.mode = FakeRouter::Mode::kUntilCancelled;
  grpc::ClientContext ctx;
  std::thread canceller([&] {
    router_.first_sent.WaitForNotification();
    ctx.TryCancel();
  });
  std::string text;
  StreamSummary s = Stream(&ctx, &text);
  canceller.join();
  EXPECT_EQ(s.status.error_code(), grpc::StatusCode::CANCELLED);
}

TEST_F(ClientTest, WaitReadyNeedsAListedModel) {
  router_.serving_model = false;
  absl::Status s = WaitReady(channel_, absl::Milliseconds(300), absl::Milliseconds(100));
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(s.message(), HasSubstr("no model listed"));
  router_.serving_model = true;
  EXPECT_TRUE(WaitReady(channel_, absl::Seconds(5)).ok());
}

TEST_F(ClientTest, WaitReadyGivesUpOnAClosedPort) {
  server_->Shutdown(absl::ToChronoTime(absl::Now()));
  server_->Wait();
  const absl::Time start = absl::Now();
  absl::Status s = WaitReady(Connect(absl::StrCat("127.0.0.1:", port_)), absl::Milliseconds(300),
                             absl::Milliseconds(100));
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(s.message(), HasSubstr("health: "));
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
}

TEST_F(ClientTest, ListModelsAndFormatting) {
  absl::StatusOr<pdserve::v1::ListModelsResponse> models = ListModels(api_.get(), absl::Seconds(5));
  ASSERT_TRUE(models.ok()) << models.status();
  EXPECT_EQ(FormatModels(*models, false),
            "stories260K block_size=16 max_context_tokens=512 vocab_size=512 fingerprint=ab12\n");
  nlohmann::json j = nlohmann::json::parse(FormatModels(*models, true));
  EXPECT_EQ(j["id"], "stories260K");
  EXPECT_EQ(j["max_context_tokens"], 512);
}

TEST(ResponseToJsonLineTest, HasTheDocumentedFields) {
  pdserve::v1::GenerateResponse r;
  r.add_token_ids(7);
  r.set_text("a\"b\xff");  // escaped quote; invalid UTF-8 is replaced, not thrown on
  std::string line = ResponseToJsonLine(r, absl::Milliseconds(2));
  EXPECT_EQ(line.find('\n'), std::string::npos);
  nlohmann::json j = nlohmann::json::parse(line);
  EXPECT_EQ(j["token_ids"], nlohmann::json::array({7}));
  EXPECT_EQ(j["text"], "a\"b\xef\xbf\xbd");
  EXPECT_DOUBLE_EQ(j["elapsed_ms"].get<double>(), 2.0);
  EXPECT_FALSE(j.contains("finish_reason"));
  EXPECT_FALSE(j.contains("usage"));

  r.set_finish_reason(pdserve::v1::FINISH_REASON_STOP_STRING);
  r.mutable_usage()->set_prompt_tokens(5);
  r.mutable_timings()->set_first_token_us(10);
  j = nlohmann::json::parse(ResponseToJsonLine(r, absl::ZeroDuration()));
  EXPECT_EQ(j["finish_reason"], "STOP_STRING");
  EXPECT_EQ(j["usage"]["prompt_tokens"], 5);
  EXPECT_EQ(j["timings"]["first_token_us"], 10);
}

TEST(FinishReasonNameTest, DropsThePrefix) {
  EXPECT_EQ(FinishReasonName(pdserve::v1::FINISH_REASON_UNSPECIFIED), "");
  EXPECT_EQ(FinishReasonName(pdserve::v1::FINISH_REASON_STOP), "STOP");
  EXPECT_EQ(FinishReasonName(pdserve::v1::FINISH_REASON_ERROR), "ERROR");
}

}  // namespace
}  // namespace pd::client
