// PeerLink: a node's pd-tierd as one part of a cluster-wide cache (issue #19 item 1; docs/tiers.md
// "Remote restore"). Each tierd with --peer_transport registers its DRAM pool with a KvTransport
// (one transport block = one DRAM slot, so any two tierds of the same KV layout can move slots
// between them) and announces its gRPC address in Redis (peer:<node>, common/redis/
// prefix_index.h). Two roles, both in every such tierd:
//
//   holder   Serve (TierService.PeerRead): pins the requested leading blocks of a chain (NVMe
//            ones are read into DRAM first, as for Promote) under a private session, writes them
//            over the transport into the slots the caller announced, waits until they are in
//            place, unpins, and returns their checksums. At most max_reads at once (more are
//            RESOURCE_EXHAUSTED); pins are released on every path.
//   fetcher  Fetch: for the blocks of a chain this node lacks (after its own leading hits), asks
//            the directory which other node holds the longest run of them, reserves DRAM slots
//            for that run, announces them (ExpectTransfer), calls the holder's PeerRead, waits
//            for the bytes, and commits each block against the holder's checksum (TierStore::
//            Commit verifies it: a corrupt block ends the run). The blocks are then ordinary
//            DRAM blocks of this node (published to Redis as such), which the caller pins with
//            Promote. Every failure (no holder, holder dead or busy, timeout, bad checksum)
//            leaves this node as it was, less the blocks committed before the failure: the
//            worker recomputes the rest.
//
// Restore or recompute (issue #19 item 2): the worker sends its measured time to compute a block
// (PromoteRequest.recompute_seconds_per_block). A holder whose measured fetch time per block
// (a moving average over whole chunks, latency included) is higher is not asked. Otherwise the
// run is fetched in chunks of chunk_blocks, chunk k due by start + (blocks through k) x the
// recompute time + 5 ms: a fetch that falls behind is abandoned at that chunk's boundary, the
// chunks before it kept. So a remote hit costs the request at most one chunk's recompute time
// plus 5 ms more than computing everything (the holder stalling right after the last good
// chunk), and fetch_timeout and the caller's deadline bound it in any case.
// Not yet: fetches that bypass this node's DRAM.
//
// Thread-safety: thread-safe. Serve runs on gRPC threads, Fetch on the Promote caller's.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/random/random.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/hash/block_hash.h"
#include "common/redis/prefix_index.h"
#include "common/redis/redis_client.h"
#include "pd/v1/tierd.grpc.pb.h"
#include "services/base/grpc_security.h"
#include "services/tierd/fetch_estimate.h"
#include "services/tierd/tier_store.h"
#include "transport/kv_transport.h"
#include "transport/registry.h"

namespace pd::tierd {

// A node holding a run of a chain's leading blocks, and where its tierd serves PeerRead.
struct PeerHolder {
  std::string node;
  std::string address;  // "host:port"
  int64_t blocks = 0;   // leading blocks of the chain it holds (DRAM or NVMe)
};

// Which other node holds what: the Redis prefix index in production, a fake in tests.
class PeerDirectory {
 public:
  virtual ~PeerDirectory() = default;
  // The node other than this one with the longest run of `chain`'s leading blocks and a known
  // address; blocks == 0 when none. Errors: the directory is unreachable.
  virtual absl::StatusOr<PeerHolder> FindHolder(absl::Span<const BlockHash> chain) = 0;
  // Tells the others where this node's tierd is (renewed periodically).
  virtual absl::Status Announce() = 0;
};

// PeerDirectory over Redis (keys in common/redis/prefix_index.h). Own connection, opened on
// first use and re-opened after a failure; the node list is re-read every `refresh`.
class RedisPeerDirectory final : public PeerDirectory {
 public:
  // `redis` is the cluster's config (its command timeout bounds each lookup); `node` this
  // node's name; `address` this tierd's gRPC address as peers dial it; `ttl` of peer:<node>.
  RedisPeerDirectory(redis::RedisConfig redis, std::string node, std::string address,
                     absl::Duration ttl, absl::Duration refresh = absl::Seconds(2));

  absl::StatusOr<PeerHolder> FindHolder(absl::Span<const BlockHash> chain) override;
  absl::Status Announce() override;

  // The address Announce publishes, when it is known only after the server bound its port.
  void SetAddress(std::string address) ABSL_LOCKS_EXCLUDED(mu_);

  // Entries found that pdserve never writes: node names, tier values, peer addresses.
  const redis::PrefixGarbageCounter& garbage() const { return garbage_; }

 private:
  absl::StatusOr<redis::RedisClient*> Client() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const redis::RedisConfig config_;
  const std::string node_;
  const absl::Duration ttl_;
  const absl::Duration refresh_;

  absl::Mutex mu_;  // one Redis conversation at a time
  std::unique_ptr<redis::RedisClient> client_ ABSL_GUARDED_BY(mu_);
  std::string address_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> others_ ABSL_GUARDED_BY(mu_);  // other nodes, from `nodes`
  absl::Time others_read_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  redis::PrefixGarbageCounter garbage_;
};

struct PeerLinkConfig {
  // The transport peers move blocks with ("tcp" or "ucx") and its listening address.
  transport::TransportConfig transport;
  int max_reads = 4;               // PeerRead served at once; >= 1
  int64_t max_fetch_blocks = 256;  // blocks asked per fetch; >= 1
  int64_t chunk_blocks = 16;       // blocks per PeerRead of a fetch; >= 1
  // Fetch whenever another node holds the blocks, ignoring the workers' recompute cost (saves
  // compute at the price of latency; tests on models too small for a fetch to pay).
  bool always_fetch = false;
  absl::Duration fetch_timeout = absl::Seconds(1);  // RPC + transfer of one fetch; > 0
  std::string node;                                 // this node's name (PeerReadRequest)

  // InvalidArgument naming the flag.
  absl::Status Validate() const;
};

// Counters since start (pd_tierd_peer_* metrics, docs/metrics.md).
struct PeerLinkStats {
  // Holder side.
  uint64_t reads_total = 0;         // PeerRead calls that sent blocks
  uint64_t reads_short_total = 0;   // answered with fewer blocks available than asked
  uint64_t reads_busy_total = 0;    // refused: max_reads in progress
  uint64_t reads_failed_total = 0;  // bad request, connect or transfer failure
  uint64_t read_blocks_total = 0;   // blocks sent
  uint64_t read_bytes_total = 0;
  int64_t reads_in_flight = 0;  // now
  int64_t pinned_blocks = 0;    // blocks pinned by reads in progress, now
  // Fetcher side.
  uint64_t decided_fetch_total = 0;          // a holder was found and fetching was the cheaper
  uint64_t decided_recompute_total = 0;      // a holder was found but computing was the cheaper
  double estimated_fetch_seconds_total = 0;  // the decisions' inputs: estimated fetch time
  double recompute_seconds_total = 0;        // and the worker's recompute time of those blocks
  uint64_t fetch_abandoned_total = 0;        // fetches cut short: a chunk fell behind the budget
  uint64_t fetches_total = 0;                // fetches attempted (fetching was decided)
  uint64_t fetch_failures_total = 0;         // fetches that stored nothing (holder dead, busy, ...)
  uint64_t lookup_failures_total = 0;        // directory lookups that failed
  uint64_t fetched_blocks_total = 0;         // blocks committed from peers
  uint64_t fetched_bytes_total = 0;
  uint64_t fetch_corrupt_total = 0;  // blocks whose bytes failed the holder's checksum
  absl::Duration fetch_time_total;   // wall time of fetches that stored blocks
  // The fetch cost measured from each holder node so far (FetchEstimate), by node name.
  struct Path {
    std::string node;
    double latency_seconds = 0;   // per request (chunk)
    double bytes_per_second = 0;  // 0 = not measured
  };
  std::vector<Path> paths;
};

class PeerLink {
 public:
  // Creates the transport and registers `store`'s DRAM pool with it. `geometry` is the pool's
  // layout as the workers' transports describe theirs (disagg::GeometryFor; the transport
  // refuses peers with another layout); its block_bytes and num_blocks are set here, one
  // transport block per DRAM slot.
  // `directory` (owned) may be null: then this node only serves. `security` makes the channels
  // to other tierds (null = plaintext). Errors: InvalidArgument (config), the transport's.
  static absl::StatusOr<std::unique_ptr<PeerLink>> Create(
      PeerLinkConfig config, TierStore* store, transport::PoolGeometry geometry,
      std::unique_ptr<PeerDirectory> directory,
      std::shared_ptr<const services::ClientSecurity> security);
  ~PeerLink();

  // The holder side of TierService.PeerRead.
  grpc::Status Serve(const pdserve::internal::v1::PeerReadRequest& req,
                     pdserve::internal::v1::PeerReadResponse* resp);

  // Brings the leading blocks of `chain` that another node holds into this node's DRAM tier
  // (committed, unpinned). Returns how many leading blocks of `chain` were stored; 0 on any
  // failure (counted, logged once in a while). Never fails the caller. The fetch ends by
  // `deadline` less a margin (the caller's own RPC deadline: the worker must not give up on
  // Promote while tierd still fetches for it) or after fetch_timeout, whichever is earlier.
  // `recompute_seconds_per_block` (0 = unknown) is the worker's measured cost of computing a
  // block: blocks are fetched only while the holder's measured fetch time per block is lower,
  // chunk by chunk, each chunk due by when computing the blocks so far would have finished
  // (the class comment's bound).
  int64_t Fetch(absl::Span<const BlockHash> chain, absl::Time deadline = absl::InfiniteFuture(),
                double recompute_seconds_per_block = 0);

  // Renews this node's address in the directory (the maintenance thread calls it).
  void Announce();

  std::string endpoint() const { return transport_->LocalEndpoint(); }
  PeerLinkStats Stats() const;

 private:
  PeerLink(PeerLinkConfig config, TierStore* store, std::unique_ptr<PeerDirectory> directory,
           std::shared_ptr<const services::ClientSecurity> security);

  pdserve::internal::v1::TierService::Stub* StubFor(const std::string& address);
  // One fetch of up to `chain.size()` blocks from `holder` within `timeout`; returns blocks
  // stored.
  int64_t FetchFrom(const PeerHolder& holder, absl::Span<const BlockHash> chain,
                    absl::Duration timeout);
  uint64_t NextId();

  const PeerLinkConfig config_;
  TierStore* const store_;
  const std::unique_ptr<PeerDirectory> directory_;
  const std::shared_ptr<const services::ClientSecurity> security_;
  std::unique_ptr<transport::KvTransport> transport_;
  transport::RegionHandle region_;
  uint64_t slot_bytes_ = 0;
  uint64_t block_bytes_ = 0;

  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::unique_ptr<pdserve::internal::v1::TierService::Stub>> stubs_
      ABSL_GUARDED_BY(mu_);
  // Measured cost of fetching from each holder node: latency and time per byte, fitted to every
  // chunk (FetchEstimate).
  absl::flat_hash_map<std::string, FetchEstimate> paths_ ABSL_GUARDED_BY(mu_);
  absl::BitGen rng_ ABSL_GUARDED_BY(mu_);
  PeerLinkStats stats_ ABSL_GUARDED_BY(mu_);
  absl::Time last_failure_log_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
};

}  // namespace pd::tierd
