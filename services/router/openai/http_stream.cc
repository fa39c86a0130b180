#include "services/router/openai/http_stream.h"

#include <utility>

#include "common/log/log.h"

namespace pd::router::openai {

namespace v1 = pdserve::v1;

void Doorbell::Ring() {
  absl::MutexLock lock(&mu_);
  ++rings_;
}

uint64_t Doorbell::rings() {
  absl::MutexLock lock(&mu_);
  return rings_;
}

void Doorbell::WaitPast(uint64_t seen, absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  auto rang = [this, seen]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return rings_ > seen; };
  mu_.AwaitWithTimeout(absl::Condition(&rang), timeout);
}

// The doorbell rings under mu_: the reader cannot see the message (or the end) before the ring
// is done, so it cannot finish the response and free the doorbell (and this sink) while the
// stream's thread still rings it. Lock order: a sink's mu_, then the doorbell's.
void BlockingSink::Send(const v1::GenerateResponse& response) {
  absl::MutexLock lock(&mu_);
  pending_ = &response;
  if (doorbell_ != nullptr) doorbell_->Ring();
}

void BlockingSink::End(const absl::Status& status) {
  absl::MutexLock lock(&mu_);
  end_ = status;
  if (doorbell_ != nullptr) doorbell_->Ring();
}

BlockingSink::Next BlockingSink::Wait(absl::Duration timeout, v1::GenerateResponse* msg,
                                      absl::Status* end) {
  absl::MutexLock lock(&mu_);
  mu_.AwaitWithTimeout(absl::Condition(this, &BlockingSink::ReadyLocked), timeout);
  if (pending_ != nullptr) {
    *msg = *pending_;
    pending_ = nullptr;
    return Next::kMessage;
  }
  if (end_.has_value()) {
    *end = *end_;
    return Next::kEnd;
  }
  return Next::kTimeout;
}

bool BlockingSink::ReadyLocked() const { return pending_ != nullptr || end_.has_value(); }

void LiveStreams::Add(HttpStream* s) {
  absl::MutexLock lock(&mu_);
  streams_.insert(s);
}

void LiveStreams::Remove(HttpStream* s) {
  absl::MutexLock lock(&mu_);
  streams_.erase(s);
}

void LiveStreams::CancelAll() {
  absl::MutexLock lock(&mu_);
  for (HttpStream* s : streams_) s->Cancel();
}

void LiveStreams::WaitIdle(absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  mu_.AwaitWithDeadline(
      absl::Condition(
          +[](absl::flat_hash_set<HttpStream*>* s) { return s->empty(); }, &streams_),
      deadline);
}

HttpStream::HttpStream(LiveStreams* live, HttpStreamOptions options)
    : live_(live), options_(std::move(options)) {}

HttpStream::~HttpStream() {
  if (stream_ == nullptr) return;
  live_->Remove(this);
  Ack(false);  // a message taken but never written (the client went away first)
  if (!ended_) {
    stream_->Cancel();
    v1::GenerateResponse msg;
    while (Next(absl::InfiniteDuration(), &msg) != BlockingSink::Next::kEnd) {
      Ack(false);
    }
  }
  stream_.reset();
}

void HttpStream::Attach(std::unique_ptr<StreamControl> stream) {
  stream_ = std::move(stream);
  live_->Add(this);
}

void HttpStream::Cancel() { stream_->Cancel(); }

BlockingSink::Next HttpStream::Next(absl::Duration timeout, v1::GenerateResponse* msg) {
  absl::Status end;
  const BlockingSink::Next n = sink_.Wait(timeout, msg, &end);
  if (n == BlockingSink::Next::kEnd) {
    ended_ = true;
    end_status_ = end;
  } else if (n == BlockingSink::Next::kMessage) {
    unacked_ = true;
  }
  return n;
}

void HttpStream::Ack(bool ok) {
  if (!unacked_) return;
  unacked_ = false;
  stream_->OnSent(ok);
}

BlockingSink::Next HttpStream::NextWhileClientThere(v1::GenerateResponse* msg) {
  for (;;) {
    const BlockingSink::Next n = Next(options_.client_check, msg);
    if (n != BlockingSink::Next::kTimeout) return n;
    if (!cancelled_ && options_.client_gone != nullptr && options_.client_gone()) {
      cancelled_ = true;
      VLOG(1) << "http: client hung up; cancelling its generation";
      stream_->Cancel();
    }
  }
}

absl::Status HttpStream::WaitFirst(v1::GenerateResponse* first) {
  NextWhileClientThere(first);
  if (!ended_ && !cancelled_) return absl::OkStatus();
  // Ended before any output, or the client is gone (nobody reads this answer; the destructor
  // acknowledges the message and waits for the cancelled stream's end).
  if (!end_status_.ok()) return end_status_;
  return ended_ ? absl::InternalError("the stream ended before any output")
                : absl::CancelledError("the client closed the connection");
}

void HttpStream::SetBuilder(ResponseBuilder builder) { builder_.emplace(std::move(builder)); }

absl::StatusOr<std::string> HttpStream::ReadBody(const v1::GenerateResponse& first) {
  builder_->Add(first);
  Ack(true);
  v1::GenerateResponse msg;
  while (!ended_) {
    if (NextWhileClientThere(&msg) == BlockingSink::Next::kMessage) {
      builder_->Add(msg);
      Ack(!cancelled_);
    }
  }
  if (!end_status_.ok()) return end_status_;
  return builder_->Body();
}

void HttpStream::StartEvents(const v1::GenerateResponse& first) {
  first_events_ = builder_->StreamEvents(first);
}

bool HttpStream::WriteEvents(EventWriter& out) {
  if (first_events_.has_value()) {
    const std::string events = *std::move(first_events_);
    first_events_.reset();
    const bool ok = events.empty() || out.Write(events);
    Ack(ok);
    return ok;
  }
  if (ended_) {
    out.Done();
    return true;
  }
  v1::GenerateResponse msg;
  switch (Next(options_.ping, &msg)) {
    case BlockingSink::Next::kMessage: {
      const std::string events = builder_->StreamEvents(msg);
      const bool ok = events.empty() || out.Write(events);
      Ack(ok);
      return ok;
    }
    case BlockingSink::Next::kTimeout:
      return out.Write(": ping\n\n");
    case BlockingSink::Next::kEnd: {
      std::string tail;
      if (!end_status_.ok()) {
        tail = ResponseBuilder::ErrorEvent(ErrorFromStatus(end_status_));
      }
      tail += ResponseBuilder::DoneEvent();
      const bool ok = out.Write(tail);
      if (ok) out.Done();
      return ok;
    }
  }
  return false;
}

void HttpStream::AddFirst(const v1::GenerateResponse& first) {
  builder_->Add(first);
  Ack(true);
}

HttpStream::Poll HttpStream::PollNext(v1::GenerateResponse* msg) {
  if (ended_) return Poll::kEnded;
  switch (Next(absl::ZeroDuration(), msg)) {
    case BlockingSink::Next::kMessage:
      return Poll::kMessage;
    case BlockingSink::Next::kEnd:
      return Poll::kEnded;
    case BlockingSink::Next::kTimeout:
      break;
  }
  return Poll::kNothing;
}

HttpStream::Poll HttpStream::PollBody() {
  v1::GenerateResponse msg;
  const Poll p = PollNext(&msg);
  if (p == Poll::kMessage) {
    builder_->Add(msg);
    Ack(!cancelled_);
  }
  return p;
}

HttpStream::Poll HttpStream::PollEvents(std::string* events) {
  if (first_events_.has_value()) {
    *events = *std::move(first_events_);
    first_events_.reset();
    return Poll::kMessage;
  }
  v1::GenerateResponse msg;
  const Poll p = PollNext(&msg);
  if (p == Poll::kMessage) *events = builder_->StreamEvents(msg);
  return p;
}

void HttpStream::CancelForClient() {
  if (cancelled_) return;
  cancelled_ = true;
  stream_->Cancel();
}

}  // namespace pd::router::openai
