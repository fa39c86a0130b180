// Test doubles for the HTTP front's streams: a scripted StreamControl that plays messages into
// a sink in lockstep (as RouterStream does) and an EventWriter that collects what a streamed
// response writes. Used by http_stream_test and sibling_streams_test.
#pragma once

#include <deque>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "pd/v1/generation.pb.h"
#include "services/router/openai/http_stream.h"
#include "services/router/router_stream.h"

namespace pd::router::openai {

namespace test_v1 = pdserve::v1;

inline test_v1::GenerateResponse Msg(const std::string& text, bool final = false) {
  test_v1::GenerateResponse m;
  m.set_request_id("r1");
  m.set_text(text);
  m.add_token_ids(7);
  if (final) {
    m.set_finish_reason(test_v1::FINISH_REASON_LENGTH);
    m.mutable_usage()->set_prompt_tokens(3);
    m.mutable_usage()->set_completion_tokens(2);
  }
  return m;
}

// Plays `messages` into `sink`, one per acknowledgement, then ends with `status`; a failed
// acknowledgement or a Cancel ends it with CANCELLED once no message is outstanding. All
// inline on the caller's thread (RouterStream may call the sink from within OnSent too).
class ScriptedStream final : public StreamControl {
 public:
  ScriptedStream(StreamSink* sink, std::vector<test_v1::GenerateResponse> messages,
                 absl::Status status, std::vector<bool>* acks, int* cancels)
      : sink_(sink),
        messages_(messages.begin(), messages.end()),
        status_(std::move(status)),
        acks_(acks),
        cancels_(cancels) {}

  // `hold`: send nothing until cancelled (a worker that has not answered yet).
  void Start(bool hold = false) {
    hold_ = hold;
    Pump();
  }
  // Whether to send nothing more until cancelled (a worker that stopped answering).
  void set_hold(bool hold) { hold_ = hold; }
  void OnSent(bool ok) override {
    acks_->push_back(ok);
    outstanding_ = false;
    if (!ok) cancelled_ = true;
    Pump();
  }
  void Cancel() override {
    ++*cancels_;
    cancelled_ = true;
    Pump();
  }

 private:
  void Pump() {
    if (outstanding_ || ended_) return;
    if (cancelled_) {
      ended_ = true;
      sink_->End(absl::CancelledError("cancelled by the client"));
    } else if (hold_) {
      return;
    } else if (!messages_.empty()) {
      current_ = messages_.front();
      messages_.pop_front();
      outstanding_ = true;
      sink_->Send(current_);
    } else {
      ended_ = true;
      sink_->End(status_);
    }
  }

  StreamSink* const sink_;
  std::deque<test_v1::GenerateResponse> messages_;
  const absl::Status status_;
  std::vector<bool>* const acks_;
  int* const cancels_;
  test_v1::GenerateResponse current_;  // valid until acknowledged
  bool hold_ = false;
  bool outstanding_ = false;
  bool cancelled_ = false;
  bool ended_ = false;
};

// Collects what a streamed response writes; fails the write numbered `fail_at` (1-based).
class FakeWriter final : public EventWriter {
 public:
  bool Write(absl::string_view bytes) override {
    if (++writes_ == fail_at) return false;
    out += std::string(bytes);
    return true;
  }
  void Done() override { done = true; }

  int fail_at = 0;
  std::string out;
  bool done = false;

 private:
  int writes_ = 0;
};

}  // namespace pd::router::openai
