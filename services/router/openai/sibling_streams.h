// SiblingStreams: the n choices of one request (`n` > 1) read by one connection thread: one
// HttpStream per choice, all ringing one Doorbell, rendered as one response: a JSON object
// whose "choices" hold every choice, or one event stream whose chunks carry each choice's
// index, interleaved as the choices' messages arrive, ended by one usage chunk (when asked) and
// one "data: [DONE]" once every choice ended.
//
// A choice that fails fails the request: non-streamed, its error is the response (the other
// choices are cancelled); streamed, its error event ends the stream.
//
// Thread-safety: one connection thread at a time, as HttpStream.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "pd/v1/generation.pb.h"
#include "services/router/openai/http_stream.h"

namespace pd::router::openai {

class SiblingStreams {
 public:
  // `streams` (every one with its builder set and its first message taken by WaitFirst) were
  // made with `options`, whose doorbell is `doorbell` (kept until the streams are gone).
  SiblingStreams(std::unique_ptr<Doorbell> doorbell,
                 std::vector<std::unique_ptr<HttpStream>> streams, HttpStreamOptions options);

  // Non-streamed: every choice read to its end (`firsts[i]` is choice i's first message).
  absl::StatusOr<std::string> ReadBody(const std::vector<pdserve::v1::GenerateResponse>& firsts);

  // Streamed: `firsts[i]`'s events are written first, choice by choice.
  void StartEvents(const std::vector<pdserve::v1::GenerateResponse>& firsts);
  // As HttpStream::WriteEvents: writes what came next of any choice (or a ping, or the end).
  bool WriteEvents(EventWriter& out);

 private:
  std::unique_ptr<Doorbell> doorbell_;  // first: destroyed after the streams ringing it
  std::vector<std::unique_ptr<HttpStream>> streams_;
  const HttpStreamOptions options_;
  size_t next_ = 0;  // round-robin start of the next poll: no choice starves the others
  bool done_ = false;
};

}  // namespace pd::router::openai
