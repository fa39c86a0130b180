// TierServiceImpl: the gRPC face of a node's TierStore (proto/pd/v1/tierd.proto): sessions,
// argument checks and proto conversion. The storage semantics are TierStore's; this class adds
// who may call what:
//   - Attach checks the worker's KvLayout against the pool's (FAILED_PRECONDITION listing every
//     differing field with both values) and opens a session with a random non-zero id;
//   - every later call names a session; an unknown one (tierd restarted, session detached or
//     dropped for idleness) fails with FAILED_PRECONDITION so the worker attaches again;
//   - malformed arguments (hash bytes not a multiple of 16, duplicate hashes in one
//     AllocateSlots, more hashes than slots) fail with INVALID_ARGUMENT naming the field.
//
// Thread-safety: thread-safe; gRPC calls it from its own threads. The maintenance thread of
// TierdServer calls PruneIdleSessions.
#pragma once

#include <cstdint>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/random/random.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/time/clock.h"
#include "pd/v1/tierd.grpc.pb.h"
#include "services/base/auth.h"
#include "services/tierd/redis_index.h"
#include "services/tierd/tier_store.h"

namespace pd::tierd {

class PeerLink;

// Counters of the service itself (the stores count the rest).
struct TierServiceStats {
  int64_t sessions = 0;                // open now
  uint64_t attaches_total = 0;         // successful Attach calls
  uint64_t attach_rejected_total = 0;  // Attach refused (layout mismatch, bad request)
  uint64_t lookups_total = 0;
  uint64_t lookup_hit_blocks_total = 0;
  uint64_t promotes_total = 0;
  uint64_t promote_hit_blocks_total = 0;
  uint64_t promote_remote_blocks_total = 0;  // of those, fetched from other nodes for the call
  uint64_t unknown_session_total = 0;        // calls naming a session tierd does not know
  uint64_t sessions_pruned_total = 0;        // dropped for idleness
};

class TierServiceImpl final : public pdserve::internal::v1::TierService::Service {
 public:
  // `store` (not owned) outlives the service. `layout` is the pool's, as workers send theirs.
  // `auth` checks the cluster token of every call (disabled by default: every call passes).
  TierServiceImpl(TierStore* store, pdserve::internal::v1::KvLayout layout,
                  services::ClusterTokenVerifier auth = {}, Clock* clock = Clock::Real());

  grpc::Status Attach(grpc::ServerContext* ctx, const pdserve::internal::v1::AttachRequest* req,
                      pdserve::internal::v1::AttachResponse* resp) override;
  grpc::Status Detach(grpc::ServerContext* ctx, const pdserve::internal::v1::DetachRequest* req,
                      pdserve::internal::v1::DetachResponse* resp) override;
  grpc::Status Lookup(grpc::ServerContext* ctx, const pdserve::internal::v1::LookupRequest* req,
                      pdserve::internal::v1::LookupResponse* resp) override;
  grpc::Status AllocateSlots(grpc::ServerContext* ctx,
                             const pdserve::internal::v1::AllocateSlotsRequest* req,
                             pdserve::internal::v1::AllocateSlotsResponse* resp) override;
  grpc::Status Commit(grpc::ServerContext* ctx, const pdserve::internal::v1::CommitRequest* req,
                      pdserve::internal::v1::CommitResponse* resp) override;
  grpc::Status Promote(grpc::ServerContext* ctx, const pdserve::internal::v1::PromoteRequest* req,
                       pdserve::internal::v1::PromoteResponse* resp) override;
  grpc::Status Release(grpc::ServerContext* ctx, const pdserve::internal::v1::ReleaseRequest* req,
                       pdserve::internal::v1::ReleaseResponse* resp) override;
  grpc::Status Stats(grpc::ServerContext* ctx, const pdserve::internal::v1::StatsRequest* req,
                     pdserve::internal::v1::TierStats* resp) override;
  // UNIMPLEMENTED without a PeerLink; PeerLink::Serve otherwise.
  grpc::Status PeerRead(grpc::ServerContext* ctx, const pdserve::internal::v1::PeerReadRequest* req,
                        pdserve::internal::v1::PeerReadResponse* resp) override;

  // The cluster-wide cache (may stay unset): PeerRead serves other nodes through it, and
  // Promote fetches from other nodes what this one lacks of a chain. Call before serving.
  void SetPeerLink(PeerLink* link) { peer_ = link; }

  // The Redis index whose state Stats reports (may stay unset: no Redis). Call before serving.
  void SetRedisIndex(const RedisIndex* index) { redis_index_ = index; }
  // This node's name, returned by Attach (AttachResponse.node_name). Call before serving.
  void SetNodeName(std::string node) { node_name_ = std::move(node); }

  // Drops sessions idle for longer than `idle` (releasing their claims). Returns how many.
  int PruneIdleSessions(absl::Duration idle);

  // Fills `stats` as the Stats RPC does (for logs and the redis fields, set by the caller).
  void FillStats(pdserve::internal::v1::TierStats* stats) const;

  TierServiceStats ServiceStats() const;

 private:
  struct Session {
    std::string worker_id;
    absl::Time last_call;
  };

  // OK and the session touched, or FAILED_PRECONDITION naming the id.
  absl::Status CheckSession(uint64_t id);

  TierStore* const store_;
  const pdserve::internal::v1::KvLayout layout_;
  const services::ClusterTokenVerifier auth_;
  Clock* const clock_;
  std::string node_name_;
  const RedisIndex* redis_index_ = nullptr;
  PeerLink* peer_ = nullptr;

  mutable absl::Mutex mu_;
  absl::flat_hash_map<uint64_t, Session> sessions_ ABSL_GUARDED_BY(mu_);
  absl::BitGen rng_ ABSL_GUARDED_BY(mu_);
  TierServiceStats counters_ ABSL_GUARDED_BY(mu_);
};

// Parses a concatenation of 16-byte block hashes; InvalidArgument naming `field` otherwise.
absl::StatusOr<std::vector<BlockHash>> ParseHashes(const std::string& bytes,
                                                   absl::string_view field);

}  // namespace pd::tierd
