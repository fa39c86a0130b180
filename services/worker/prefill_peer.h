// PrefillPeer: what the decode side of a disaggregated prefill needs of a prefill worker, the
// PrefillService.Prefill call (proto/pd/v1/worker.proto), asynchronously. RemotePrefill talks
// to this interface only; GrpcPrefillPeers implements it over gRPC (one channel per prefill
// worker, the channel settings below), and tests plug in a peer that runs the prefill side
// (PrefillJob) in the same process.
#pragma once

#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "pd/v1/worker.pb.h"
#include "services/base/grpc_security.h"

namespace pd::worker {

// Thread-safe: Prefill may be called from any thread, for many requests at once.
class PrefillPeer {
 public:
  // The call's outcome: OK with the prefill worker's response, or why it failed (the peer's
  // own error, Unavailable when unreachable, DeadlineExceeded past the deadline).
  using Done = absl::AnyInvocable<void(const absl::Status& status,
                                       pdserve::internal::v1::PrefillResponse response)>;

  virtual ~PrefillPeer() = default;

  // Asks the prefill worker to prefill `request` by `deadline`. `done` runs at most once, on
  // any thread, possibly before Prefill returns; a well-behaved peer runs it exactly once and
  // by the deadline, but callers must not rely on that (RemotePrefill gives up on its own).
  virtual void Prefill(pdserve::internal::v1::PrefillRequest request, absl::Time deadline,
                       Done done) = 0;
};

// PrefillPeers over gRPC, one per prefill worker address, each on its own channel created on
// first use and kept for the life of this object (with TLS and the cluster token of
// `security`). Thread-safe.
class GrpcPrefillPeers {
 public:
  // `security` null = plaintext, no token.
  explicit GrpcPrefillPeers(std::shared_ptr<const services::ClientSecurity> security);
  ~GrpcPrefillPeers();
  GrpcPrefillPeers(const GrpcPrefillPeers&) = delete;
  GrpcPrefillPeers& operator=(const GrpcPrefillPeers&) = delete;

  // The peer at `address` ("host:port"); valid as long as this object. Never fails: an
  // unreachable address fails each call instead.
  PrefillPeer* Get(const std::string& address);

 private:
  const std::shared_ptr<const services::ClientSecurity> security_;
  absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::unique_ptr<PrefillPeer>> peers_ ABSL_GUARDED_BY(mu_);
};

}  // namespace pd::worker
