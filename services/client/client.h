// The RPC side of pd-client: connecting to a router, waiting until it is ready, listing models,
// streaming one Generate call, and formatting what came back (text, JSON lines, usage stats).
//
// Functions are thread-compatible; StreamGenerate may be cancelled from another thread through
// grpc::ClientContext::TryCancel on the context it was given (which is thread-safe).
#pragma once

#include <grpcpp/grpcpp.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "pd/v1/generation.grpc.pb.h"
#include "services/base/grpc_security.h"
#include "services/base/shutdown_signal.h"

namespace pd::client {

// Channel arguments with a reconnect backoff of 100 ms to 500 ms. gRPC's defaults back off for
// up to two minutes after a refused connection, so a client that starts before the router
// would otherwise notice it only long after it came up.
grpc::ChannelArguments FastReconnectChannelArgs();

// An insecure channel to `address` ("127.0.0.1:50051") with FastReconnectChannelArgs().
std::shared_ptr<grpc::Channel> Connect(const std::string& address);
// The same with `security`'s TLS and headers (the API key).
std::shared_ptr<grpc::Channel> Connect(const std::string& address,
                                       const services::ClientSecurity& security);

// Ready means: the gRPC health service answers SERVING for the whole server, and ListModels
// lists at least one model (the router lists a model only while a decode worker is up). Tries
// every 100 ms, each attempt bounded by `attempt_timeout`, until ready or `timeout` has passed.
// DeadlineExceeded with the last reason ("health: UNAVAILABLE: ...", "no model listed yet")
// when not ready in time.
absl::Status WaitReady(const std::shared_ptr<grpc::Channel>& channel, absl::Duration timeout,
                       absl::Duration attempt_timeout = absl::Seconds(1));

// One ListModels call bounded by `timeout`. The gRPC status converted (codes 1:1) on failure.
absl::StatusOr<pdserve::v1::ListModelsResponse> ListModels(
    pdserve::v1::Generation::StubInterface* stub, absl::Duration timeout);

// One line per model: "<id> block_size=16 max_context_tokens=512 vocab_size=512
// fingerprint=<hex>", each ending in "\n"; with `json`, one JSON object per line instead.
std::string FormatModels(const pdserve::v1::ListModelsResponse& models, bool json);

// What one Generate stream gave, seen from the client.
struct StreamSummary {
  grpc::Status status;                 // how the call ended
  pdserve::v1::GenerateResponse last;  // the last message (finish reason, usage, timings)
  std::string request_id;              // the server's id, from the first message carrying one
  int messages = 0;                    // messages received
  uint64_t tokens = 0;                 // generated token ids received
  std::optional<absl::Duration> ttft;  // call start -> first message with a token
  absl::Duration total;                // call start -> end of the stream
};

// Called on the thread running StreamGenerate, for every message as it arrives, with the time
// since the call started.
using ResponseSink =
    std::function<void(const pdserve::v1::GenerateResponse& response, absl::Duration elapsed)>;

// Runs one Generate call on `context` (the caller sets its deadline, and may cancel it from
// another thread with TryCancel: the stream then ends with CANCELLED) and hands every message
// to `sink`. Never fails itself: the outcome is StreamSummary::status.
StreamSummary StreamGenerate(pdserve::v1::Generation::StubInterface* stub,
                             grpc::ClientContext* context,
                             const pdserve::v1::GenerateRequest& request, const ResponseSink& sink);

// "LENGTH" for FINISH_REASON_LENGTH, "" for FINISH_REASON_UNSPECIFIED.
std::string FinishReasonName(pdserve::v1::FinishReason reason);

// One response as a single-line JSON object (no trailing newline): token_ids, text,
// elapsed_ms (client side), and when set finish_reason, request_id, usage and timings.
// Invalid UTF-8 in text is replaced by U+FFFD rather than failing.
std::string ResponseToJsonLine(const pdserve::v1::GenerateResponse& response,
                               absl::Duration elapsed);

// The usage line printed on stderr after a stream, e.g. "prompt_tokens=5 cached_tokens=0
// generated_tokens=64 ttft=2.1ms total=40.3ms finish_reason=LENGTH request_id=... (server:
// queue=... first_token=... total=...)". No trailing newline.
std::string FormatStats(const StreamSummary& summary);

// Turns Ctrl-C (SIGINT) and SIGTERM into a clean stop: the registered call is cancelled with
// TryCancel (its stream then ends with CANCELLED); with no call registered the process prints
// "pd-client: interrupted" and exits with status 130 at once. A second signal always exits 130.
// One instance per process, created before any other thread; thread-safe.
class Interrupter {
 public:
  Interrupter();
  ~Interrupter();
  Interrupter(const Interrupter&) = delete;
  Interrupter& operator=(const Interrupter&) = delete;

  // The call a signal cancels; nullptr = none. `context` must outlive its registration.
  void SetActive(grpc::ClientContext* context);
  // True once a signal arrived.
  bool interrupted() const;

 private:
  void Watch();

  services::ShutdownSignal signal_;
  mutable absl::Mutex mu_;
  grpc::ClientContext* active_ ABSL_GUARDED_BY(mu_) = nullptr;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool interrupted_ ABSL_GUARDED_BY(mu_) = false;
  std::thread watcher_;
};

// "UNAVAILABLE: no decode worker is up" (the canonical code name, then the message).
std::string FormatRpcError(const grpc::Status& status);

}  // namespace pd::client
