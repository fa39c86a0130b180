// RouterStream: one client's Generate stream, relayed from a DecodeService.Generate call on the
// decode worker a placement chose, independent of the protocol the client speaks.
//
// The stream runs in lockstep: read one worker message, hand it to the client's StreamSink,
// read the next once the sink says it was sent. The client's stream ends (StreamSink::End) once
// the worker call is done; its status is the outcome, with two rewrites: a worker ending without
// a finish reason is INTERNAL, and a worker failing with UNAVAILABLE is UNAVAILABLE "... (retry)"
// (the client may retry; the worker is out of the pool until it answers health checks again).
//
// A decode worker that fails with UNAVAILABLE before anything was sent to the client (it died,
// or was unreachable) is retried once on another placement: the request is the same (same
// seed), so the output is what the first worker would have produced.
//
// One that fails with UNAVAILABLE after tokens reached the client (it died, or drained on
// SIGTERM) hands the stream to another decode worker, up to --max_migrations times: the same
// request with the tokens streamed so far as its ResumeState (docs/migration.md), which that
// worker continues exactly as the first would have (same seed: draws depend on (seed, step);
// text held back resumes at the streamed offset). The client sees one stream: no token twice
// or missing, usage counted once (the last worker counts the resumed tokens).
//
// The gRPC front (GenerationService::Generate) drives it through a ServerWriteReactor; another
// front (HTTP) gets one from GenerationService::NewStream with a sink of its own, so admission,
// placement, relay, retry and metrics stay in one place. What the stream needs of the service
// that made it is the RouterStreamHost interface (GenerationService implements it; tests fake
// it).
//
// Thread-safety: the methods may be called from any thread, concurrently with the worker
// call's reactions (gRPC callback threads); the class is thread-safe.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/hash/block_hash.h"
#include "common/metrics/metrics.h"
#include "pd/v1/generation.pb.h"
#include "pd/v1/worker.grpc.pb.h"
#include "services/router/placement_policy.h"
#include "services/router/worker_pool.h"

namespace pd::router {

// The metrics a stream records: families of its host's registry, registered by the host.
struct RouterStreamMetrics {
  metrics::Family<metrics::Counter>* requests = nullptr;  // {method, code}
  metrics::Family<metrics::Histogram>* ttft = nullptr;
  metrics::Family<metrics::Histogram>* tpot = nullptr;
  metrics::Family<metrics::Histogram>* itl = nullptr;
  metrics::Family<metrics::Histogram>* e2e = nullptr;
  metrics::Family<metrics::Counter>* tokens = nullptr;  // {kind}
  metrics::Family<metrics::Counter>* retries = nullptr;
  metrics::Family<metrics::Counter>* migrations = nullptr;  // {reason, result}
  // The gap between the last token before a move and the first after it, as the client sees.
  metrics::Family<metrics::Histogram>* migration_stall = nullptr;

  // Counts one public API call of `method` that ended with `code` (pd_router_requests_total).
  void CountRequest(absl::string_view method, absl::StatusCode code) const;
};

// What a RouterStream needs of the service that made it (GenerationService; fakes in tests).
// Implementations are thread-safe: streams call them from gRPC's callback threads.
class RouterStreamHost {
 public:
  virtual ~RouterStreamHost() = default;
  // The workers the stream's placements index: their stubs, in-flight counts and failures.
  virtual WorkerPool* workers() = 0;
  // Places the request again when its decode worker failed before the first token.
  virtual PlacementPolicy* policy() = 0;
  virtual const RouterStreamMetrics& stream_metrics() const = 0;
  // How many times a stream may move to another decode worker (--max_migrations).
  virtual int max_migrations() const = 0;
  // The block-hash chain of `tokens` under `cache_salt` (as DecodeRequest.block_hashes): for a
  // stream that moves, its prompt followed by the tokens it streamed.
  virtual absl::StatusOr<std::vector<BlockHash>> BlockHashesOf(
      const std::string& cache_salt, absl::Span<const uint32_t> tokens) = 0;
  // A stream's slots (of --max_inflight and of its tenant's --max_streams_per_tenant) are
  // free: called once per stream, before the client can see the stream end, so that a client
  // sending its requests one after another is never refused.
  virtual void ReleaseStream(const std::string& tenant) = 0;
};

// What the owner of a StreamSink calls on the stream that feeds it: RouterStream implements
// it; front-end tests fake it.
class StreamControl {
 public:
  virtual ~StreamControl() = default;
  // The sink finished the last Send: `ok` = written, false = the client is gone (the worker
  // call is cancelled and the stream ends).
  virtual void OnSent(bool ok) = 0;
  // The client cancelled (or its deadline passed): the worker call is cancelled; the stream
  // ends with the worker call's status. Idempotent; may come before Start.
  virtual void Cancel() = 0;
};

// The client side of one RouterStream: how its messages and its end reach the client.
// Implementations: the gRPC ServerWriteReactor of GenerationService::Generate, the HTTP
// front's BlockingSink (openai/http_stream.h); test sinks.
class StreamSink {
 public:
  virtual ~StreamSink() = default;
  // Starts sending `response` to the client. `response` stays valid and unchanged until the
  // sink calls RouterStream::OnSent, which it must do exactly once per Send (ok = false when the
  // client is gone). At most one Send is outstanding; Send is never called after End.
  // Called with no lock of the stream held: OnSent may be called before Send returns.
  virtual void Send(const pdserve::v1::GenerateResponse& response) = 0;
  // Ends the client's stream with `status` (OK = it ended with a finish reason). Called exactly
  // once, when no Send is outstanding, with no lock of the stream held.
  virtual void End(const absl::Status& status) = 0;
};

class RouterStream final : public StreamControl {
 public:
  static constexpr int kMaxAttempts = 2;

  // A stream of `decode` (prepared and placed by GenerationService) to `placement`'s workers.
  // Nothing starts before Start. `host` and `sink` must outlive the stream; `deadline`
  // bounds every attempt (InfiniteFuture = none). The stream holds one of the host's stream
  // slots (taken by GenerationService::NewStream), released (RouterStreamHost::ReleaseStream)
  // before the client sees the end, or when the stream is destroyed.
  RouterStream(RouterStreamHost* host, StreamSink* sink,
               pdserve::internal::v1::DecodeRequest decode, Placement placement,
               absl::Time deadline);
  // Destroy only after StreamSink::End was called, or when Start never was: the worker calls
  // are done then.
  ~RouterStream() override;

  RouterStream(const RouterStream&) = delete;
  RouterStream& operator=(const RouterStream&) = delete;

  // Starts the first worker call. Call once, when the sink can reach this stream (its Send
  // reactions call OnSent). Sink calls follow on gRPC's threads.
  void Start();
  void OnSent(bool ok) override;
  void Cancel() override;
  // The pool index of the decode worker the stream runs on (its latest attempt's).
  int decode_index();

 private:
  struct Attempt;
  class Upstream;

  Attempt* NewAttemptLocked(Placement placement) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Launch(Attempt* a);
  void EndAttemptLocked(const Attempt& a) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void OnUpstreamRead(Attempt* a, bool ok);
  void OnUpstreamDone(Attempt* a, const absl::Status& status);
  Attempt* Retry(const absl::Status& why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  Attempt* Migrate(const absl::Status& why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::optional<absl::Status> MaybeFinishLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  RouterStreamHost* const host_;
  StreamSink* const sink_;
  pdserve::internal::v1::DecodeRequest decode_;  // changed only between attempts (prefill_address)
  const absl::Time deadline_;
  const absl::Time received_;
  absl::Mutex mu_;
  Placement first_placement_ ABSL_GUARDED_BY(mu_);  // until Start
  std::unique_ptr<Attempt> attempt_ ABSL_GUARDED_BY(mu_);
  // Finished attempts: kept until the stream is deleted, as Cancel may still name one.
  std::vector<std::unique_ptr<Attempt>> retired_ ABSL_GUARDED_BY(mu_);
  int attempts_ ABSL_GUARDED_BY(mu_) = 0;
  // The message being sent: written under mu_ while no Send is outstanding (writing_ false),
  // read by the sink until OnSent.
  pdserve::v1::GenerateResponse out_;
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool relayed_ ABSL_GUARDED_BY(mu_) = false;  // something was sent to the client
  bool upstream_done_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  bool tenant_released_ ABSL_GUARDED_BY(mu_) = false;
  bool first_ ABSL_GUARDED_BY(mu_) = true;
  bool got_final_ ABSL_GUARDED_BY(mu_) = false;
  bool read_failed_ ABSL_GUARDED_BY(mu_) = false;
  bool cancelled_by_client_ ABSL_GUARDED_BY(mu_) = false;
  int64_t completion_tokens_ ABSL_GUARDED_BY(mu_) = 0;
  // What reached the client (the resume state of a move): every token, and the worker's text
  // offset after the last message.
  std::vector<uint32_t> streamed_ ABSL_GUARDED_BY(mu_);
  uint64_t text_offset_ ABSL_GUARDED_BY(mu_) = 0;
  int migrations_ ABSL_GUARDED_BY(mu_) = 0;
  // Set by a move: the next token's gap is the move's stall (until then InfinitePast).
  absl::Time moved_after_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  // Why the stream could not move (budget spent, no worker): appended to its UNAVAILABLE.
  std::string not_moved_ ABSL_GUARDED_BY(mu_);
  absl::Time first_token_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  absl::Time last_token_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  pdserve::v1::Usage usage_ ABSL_GUARDED_BY(mu_);
  absl::Status status_ ABSL_GUARDED_BY(mu_);
};

}  // namespace pd::router
