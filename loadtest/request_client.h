// The backend seam of the load runner: a RequestClient sends the requests of one target (or
// both targets of a comparison) over its protocol — pdserve.v1.Generation over gRPC
// (grpc_client.h) or the OpenAI HTTP API (openai_client.h) — and reports each request's
// RequestRecord (metrics.h) to the runner, which paces arrivals, bounds requests in flight and
// collects the records without knowing the protocol.
//
// Life of a request: the runner's issuer thread calls Prepare (builds the request, nothing is
// sent), registers the returned InFlight, then calls Start, which hands it to the client. The
// client sends it and calls RequestSink::Finished exactly once, on one of its own threads, with
// the record; it deletes the InFlight after Finished returns. Between Start and Finished the
// runner may call InFlight::Cancel (Stop, Ctrl-C) under its own lock.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "loadtest/metrics.h"
#include "loadtest/workload.h"

namespace pd::loadtest {

// The protocol of a target.
enum class Backend {
  kGrpc,    // pdserve.v1.Generation (pd-router)
  kOpenAi,  // OpenAI-compatible HTTP: /v1/completions or /v1/chat/completions, SSE streaming
};

// One request between Start and Finished. Owned by its client.
class InFlight {
 public:
  virtual ~InFlight() = default;
  // Ends the request promptly (its record then reports a cancelled request). Called by the
  // runner with its mutex held: must not block or call back into the runner. At most once.
  virtual void Cancel() = 0;
  // Set under the runner's mutex by Stop, read under it by Finished.
  bool cancelled_by_client = false;
};

// What clients report to: the run's clock, the progress counter and the end of each request.
// Thread-safe.
class RequestSink {
 public:
  virtual ~RequestSink() = default;
  // Nanoseconds since the start of the run (steady clock).
  int64_t NowNs() const {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
               .count() -
           start_steady_ns_.load(std::memory_order_acquire);  // pairs with the store in Run
  }
  // Output tokens received so far (the progress display); relaxed, a counter only.
  void AddOutputTokens(int64_t n) { output_tokens_.fetch_add(n, std::memory_order_relaxed); }
  // The end of `request` (exactly once per started request, on a client thread). The client
  // deletes `request` after this returns.
  virtual void Finished(InFlight* request, RequestRecord record) = 0;

 protected:
  // Steady-clock time of the start; 0 before. Release/acquire: client threads read it.
  std::atomic<int64_t> start_steady_ns_{0};
  std::atomic<int64_t> output_tokens_{0};
};

// Per-request settings that are not in the workload's RequestSpec.
struct RequestParams {
  std::string cache_salt;  // "" = unset
  std::string client_request_id;
};

// Sends requests over one protocol. Prepare and Start are called from one thread (the runner's
// issuer); the sink outlives the client.
class RequestClient {
 public:
  virtual ~RequestClient() = default;
  // Builds the request for `spec` to `record.target` (0 = the target, 1 = the compare target),
  // moving spec.prompt out when `move_prompt`. Sends nothing.
  virtual std::unique_ptr<InFlight> Prepare(RequestSpec& spec, bool move_prompt,
                                            const RequestParams& params, RequestRecord record) = 0;
  // Sends `request` (from Prepare of this client); Finished follows on a client thread.
  virtual void Start(std::unique_ptr<InFlight> request) = 0;
};

}  // namespace pd::loadtest
