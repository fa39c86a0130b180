// HttpStream: one generation request of the HTTP front (http_front.h), between the RouterStream
// that relays the worker's answer and the HTTP response being written: a non-streamed JSON
// object (ReadBody) or server-sent events (WriteEvents, driven by httplib's chunked content
// provider through an EventWriter).
//
// Every message taken from the stream is acknowledged (StreamControl::OnSent) exactly once,
// whatever it renders to: RouterStream relays in lockstep, and a message left unacknowledged
// would keep the stream, its slot and the connection thread forever.
//
// Thread-safety: an HttpStream is used by one connection thread at a time; the sink's Send/End
// come from the stream's threads; LiveStreams is thread-safe.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "pd/v1/generation.pb.h"
#include "services/router/openai/openai_response.h"
#include "services/router/router_stream.h"

namespace pd::router::openai {

// Wakes one thread reading several streams (the choices of a request with n > 1): each of
// their sinks rings it when a message or the end arrives. Thread-safe.
class Doorbell {
 public:
  void Ring();
  // How many times it rang so far.
  uint64_t rings();
  // Waits until it rang more than `seen` times (a value of rings()) or `timeout` passed.
  void WaitPast(uint64_t seen, absl::Duration timeout);

 private:
  absl::Mutex mu_;
  uint64_t rings_ ABSL_GUARDED_BY(mu_) = 0;
};

// The client side of one RouterStream for a connection thread that waits on it: the stream
// hands a message over (Send) and the thread takes it (Wait), writes it, and acknowledges it.
class BlockingSink final : public StreamSink {
 public:
  // `doorbell` (may be null; must outlive the sink) rings after every Send and End.
  explicit BlockingSink(Doorbell* doorbell = nullptr) : doorbell_(doorbell) {}
  void Send(const pdserve::v1::GenerateResponse& response) override;
  void End(const absl::Status& status) override;

  enum class Next { kMessage, kEnd, kTimeout };
  // Waits up to `timeout` for a message (copied to `msg`; acknowledge it with OnSent) or the
  // stream's end (its status in `end`).
  Next Wait(absl::Duration timeout, pdserve::v1::GenerateResponse* msg, absl::Status* end);

 private:
  bool ReadyLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  Doorbell* const doorbell_;
  absl::Mutex mu_;
  const pdserve::v1::GenerateResponse* pending_ ABSL_GUARDED_BY(mu_) = nullptr;
  std::optional<absl::Status> end_ ABSL_GUARDED_BY(mu_);
};

class HttpStream;

// The streams running, so that Stop can cancel them and Drain wait for them.
class LiveStreams {
 public:
  void Add(HttpStream* s);
  void Remove(HttpStream* s);
  // Cancels every stream running.
  void CancelAll();
  // Waits until no stream runs or `deadline` passes.
  void WaitIdle(absl::Time deadline);

 private:
  absl::Mutex mu_;
  absl::flat_hash_set<HttpStream*> streams_ ABSL_GUARDED_BY(mu_);
};

// Where a streamed response's bytes go: httplib's DataSink on a connection; fakes in tests.
class EventWriter {
 public:
  virtual ~EventWriter() = default;
  // Writes `bytes` to the client; false when the client is gone.
  virtual bool Write(absl::string_view bytes) = 0;
  // Ends the response.
  virtual void Done() = 0;
};

struct HttpStreamOptions {
  // How often a request waiting for its first message (or a non-streamed one for its end)
  // checks whether its client has hung up.
  absl::Duration client_check = absl::Seconds(1);
  // How often an idle event stream writes an SSE comment: a client that stops reading is
  // noticed (the write fails) and its generation cancelled.
  absl::Duration ping = absl::Seconds(5);
  // True when the client has hung up (CurrentClientGone on a connection thread); null = never.
  std::function<bool()> client_gone;
  // Rung when a message or the end arrives (SiblingStreams); null = none. Must outlive the
  // stream.
  Doorbell* doorbell = nullptr;
};

class HttpStream {
 public:
  // `live` must outlive the stream.
  HttpStream(LiveStreams* live, HttpStreamOptions options);
  // A stream that has not ended is cancelled and waited for first (RouterStream may be
  // destroyed only after its end); a message taken but never written is acknowledged as not
  // sent.
  ~HttpStream();

  HttpStream(const HttpStream&) = delete;
  HttpStream& operator=(const HttpStream&) = delete;

  // The sink to create the stream with (GenerationService::NewStream).
  StreamSink* sink() { return &sink_; }
  // Takes the stream whose sink is sink() and makes it cancellable through `live`. Call once,
  // before the stream starts.
  void Attach(std::unique_ptr<StreamControl> stream);
  // Cancels the generation (Stop; a client that hung up).
  void Cancel();

  // Waits for the first message (`first`; it decides the HTTP status), cancelling the
  // generation once the client has hung up. OK when it came; else the status to answer with:
  // the stream's error, Internal when it ended before any output, Cancelled when the client
  // left.
  absl::Status WaitFirst(pdserve::v1::GenerateResponse* first);
  // The response's encoder, used from then on. Call once, after WaitFirst.
  void SetBuilder(ResponseBuilder builder);

  // Non-streamed: adds `first` and every message after it to the builder until the stream
  // ends. The response body, or the stream's error.
  absl::StatusOr<std::string> ReadBody(const pdserve::v1::GenerateResponse& first);

  // Streamed: `first`'s events are written by the first WriteEvents (the message stays
  // unacknowledged until then; they may be empty: its token's text can be held back).
  void StartEvents(const pdserve::v1::GenerateResponse& first);
  // Writes what comes next to `out`: the first message's events, a message's events, a ping
  // when nothing came within options.ping, or the end (an error event when the stream failed,
  // then "data: [DONE]", then out.Done()). False when a write failed (the client is gone: the
  // generation is cancelled). Call again while it returns true and the response is not done.
  bool WriteEvents(EventWriter& out);

  // For one thread reading several streams (SiblingStreams), without waiting:
  enum class Poll { kNothing, kMessage, kEnded };
  // Non-streamed: `first` is added to the builder and acknowledged.
  void AddFirst(const pdserve::v1::GenerateResponse& first);
  // Non-streamed: adds the next message to the builder and acknowledges it, when one came.
  Poll PollBody();
  // Streamed (after StartEvents): the next message's events in `events` (possibly empty),
  // unacknowledged until Written; kEnded once the stream ended (end_status()).
  Poll PollEvents(std::string* events);
  // The events PollEvents returned were written (`ok`) or not (the client is gone).
  void Written(bool ok) { Ack(ok); }
  // The client hung up: the generation is cancelled.
  void CancelForClient();
  bool ended() const { return ended_; }
  const absl::Status& end_status() const { return end_status_; }
  ResponseBuilder& builder() { return *builder_; }

 private:
  // The next message (to be acknowledged with Ack), or the end (ended_/end_status_ set). Waits
  // at most `timeout`. Call only with no message unacknowledged.
  BlockingSink::Next Next(absl::Duration timeout, pdserve::v1::GenerateResponse* msg);
  // Next, waiting as long as it takes, but cancelling the generation once the client has hung
  // up (checked every options.client_check): a client that leaves before the first token, or
  // during a non-streamed generation, frees its worker and slot within that bound.
  BlockingSink::Next NextWhileClientThere(pdserve::v1::GenerateResponse* msg);
  // Next without waiting, as a Poll (the message, unacknowledged, in `msg`).
  Poll PollNext(pdserve::v1::GenerateResponse* msg);
  // The message Next returned was written (`ok`) or not (false: the client is gone, the
  // generation is cancelled). No-op when none is outstanding.
  void Ack(bool ok);

  LiveStreams* const live_;
  const HttpStreamOptions options_;
  BlockingSink sink_{options_.doorbell};
  std::unique_ptr<StreamControl> stream_;
  std::optional<ResponseBuilder> builder_;   // once the first message came
  std::optional<std::string> first_events_;  // streams: the first message's SSE, until written
  bool unacked_ = false;
  bool cancelled_ = false;  // the client hung up
  bool ended_ = false;
  absl::Status end_status_;
};

}  // namespace pd::router::openai
