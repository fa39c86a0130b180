// OpenAiClient: the RequestClient of OpenAI-compatible HTTP targets (vLLM, SGLang, pd-router's
// HTTP API, ...), and the readiness probe of such a target. Requests are streaming POSTs to
// /v1/completions (the workload's token ids as `prompt`) or /v1/chat/completions (the prompt
// decoded to text by a tokenizer, as one user message); openai_stream.h builds the bodies and
// turns the server-sent events into RequestRecords.
//
// Threads: cpp-httplib's client is blocking, so each request in flight has a worker thread,
// taken from a pool that grows on demand up to the most requests ever in flight at once (the
// runner's concurrency) and keeps its threads, each with one keep-alive connection, for the
// next requests. A reaper thread ends requests that passed their deadline or were cancelled
// by shutting their connection down (httplib's Client::stop), so Stop() ends even a stream
// that is waiting for its first byte within ~10 ms.
//
// Thread-safety: as RequestClient; Finished is called on the worker threads.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "engine/model/tokenizer.h"
#include "loadtest/openai_stream.h"
#include "loadtest/request_client.h"
#include "loadtest/sampling_penalties.h"

namespace pd::loadtest {

struct OpenAiClientOptions {
  std::string url;  // the target (ParseOpenAiUrl)
  OpenAiEndpoint endpoint = OpenAiEndpoint::kCompletions;
  std::string model;    // the `model` field; required by most servers (resolved by the probe)
  std::string api_key;  // sent as "Authorization: Bearer <key>"; "" = none
  std::string tls_ca;   // https: PEM CA file; "" = the system's CAs
  // Chat: turns prompt token ids into text; required for kChat. Shared by the clients of both
  // targets and the LoadRun that loaded it; immutable.
  std::shared_ptr<const engine::Tokenizer> tokenizer;
  absl::Duration connect_timeout = absl::Seconds(5);
  absl::Duration request_timeout = absl::Minutes(10);  // zero = none
  bool ignore_eos = true;
  double temperature = 0;
  SamplingPenalties penalties;  // sent when not zero
  std::string json_schema;  // response_format json_schema when not empty

  // InvalidArgument for a bad URL or a chat endpoint without a tokenizer.
  absl::Status Validate() const;
};

// GET <api_root>/models on `options.url`, retried while the target refuses connections, for up
// to options.connect_timeout; returns the model `model` ("" = the first listed). Errors, each
// naming the target: Unavailable when it cannot be reached in time or lists no model;
// NotFound when `model` is not listed (the message lists what is); the HTTP error's status
// (HttpErrorStatus) otherwise, e.g. Unauthenticated for a wrong API key.
absl::StatusOr<OpenAiModel> ProbeOpenAiTarget(const OpenAiClientOptions& options,
                                              absl::string_view model);

class OpenAiClient : public RequestClient {
 public:
  // InvalidArgument from options.Validate().
  static absl::StatusOr<std::unique_ptr<OpenAiClient>> Create(RequestSink* sink,
                                                              OpenAiClientOptions options);
  // Joins the worker and reaper threads. Every started request must have finished.
  ~OpenAiClient() override;

  std::unique_ptr<InFlight> Prepare(RequestSpec& spec, bool move_prompt,
                                    const RequestParams& params, RequestRecord record) override;
  void Start(std::unique_ptr<InFlight> request) override;

  class Impl;  // the pool and the reaper (public for the .cc's request class)

 private:
  explicit OpenAiClient(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace pd::loadtest
