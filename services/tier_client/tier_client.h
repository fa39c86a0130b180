// TierClient: a worker's side of its node's pd-tierd (proto/pd/v1/tierd.proto), the real
// TierLink (tier_link.h): it attaches, maps the shared DRAM pool (services/tier_shm), offers the
// blocks its pool evicts (G1 -> G2) and makes the tiers' blocks of a prompt readable before the
// prompt is admitted (G2/G3 -> G1).
//
//   Offer(hash, bytes)      scheduler thread, inside the pool's eviction: copies the block into
//                           a bounded staging area and returns; the client thread later runs
//                           AllocateSlots -> copy into the granted slots -> Commit, in batches.
//                           Staging full or tierd down -> the block is dropped (counted).
//   Prepare(chain, done)    any thread: the client thread asks Promote for the chain's leading
//                           blocks and calls `done` with a PromotedRun (pinned slots), or with
//                           nullptr when tierd has none or cannot be reached. Exactly once.
//   PromotedRun::CopyOut    copies a pinned block into the worker's pool and verifies it
//                           against tierd's checksum (false on mismatch: the caller stops).
//   Release(run)            unpins the run's slots (queued; the client thread sends it).
//
// Failure: tierd down or restarted never fails a request: Prepare answers nullptr, offers are
// dropped, and the client re-attaches (remapping the pool) in the background. A lease that ran
// out before CopyOut is caught by the checksum. Prepare jobs go before offers, since a request
// waits for them.
//
// Thread-safety: thread-safe. One internal thread makes every RPC; `done` runs on it and must
// be quick.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/any_invocable.h"
#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/hash/block_hash.h"
#include "pd/v1/tierd.grpc.pb.h"
#include "services/base/grpc_security.h"
#include "services/tier_client/tier_link.h"
#include "services/tier_shm/shm_region.h"
#include "services/tier_shm/tier_kind.h"

namespace pd::tier_client {

struct TierClientConfig {
  std::string tierd_address;  // "host:port" of the node's pd-tierd. Required.
  std::string worker_id;      // for tierd's logs. Required.
  // The worker's node name (WorkerInfo.node_name); a tierd reporting another one is logged as
  // an error and counted (the router would credit the wrong node). Empty = not checked.
  std::string node_name;
  pdserve::internal::v1::KvLayout layout;  // the worker's; tierd refuses a different one
  // TLS and the cluster token for the channel to tierd (the worker's peer security); null =
  // plaintext, no token.
  std::shared_ptr<const services::ClientSecurity> security;
  int64_t max_staged_blocks = 256;  // evicted blocks waiting to be offered (memory bound)
  int64_t offer_batch_blocks = 64;  // blocks per AllocateSlots/Commit round
  // DRAM slots kept reserved without a block (tierd.proto AllocateSlots.unbound_slots; at most
  // an eighth of tierd's pool), so an
  // evicted block is copied once, straight into shared memory (from a GPU pool: cudaMemcpyAsync
  // into the page-locked slot), and named at Commit. 0 = every offer goes through staging.
  int64_t unbound_slots = 0;
  absl::Duration rpc_timeout = absl::Seconds(2);
  absl::Duration reattach_interval = absl::Seconds(1);
  // Called on the client thread each time tierd's DRAM pool is mapped (attach and every
  // re-attach) with the mapping; the callable it returns runs right before that mapping is
  // unmapped. A worker whose KV pool is GPU memory page-locks the mapping here
  // (cudaHostRegister), so restores copy shm -> device with DMA. Empty = none.
  std::function<absl::AnyInvocable<void()>(uint8_t* data, size_t size_bytes)> on_map;

  // InvalidArgument naming the field.
  absl::Status Validate() const;
};

class TierClient;

// The real client's PromotedRun: slots of tierd's DRAM pool pinned for this worker's session,
// read through the client's mapping (kept alive by the run).
class ShmPromotedRun final : public PromotedRun {
 public:
  size_t size() const override { return slots_.size(); }
  int64_t block_bytes() const override { return block_bytes_; }
  tier_shm::TierKind source(size_t k) const override { return sources_[k]; }
  bool CopyOut(size_t k, uint8_t* dst) const override;
  const uint8_t* BlockBytes(size_t k) const override;
  bool Verify(size_t k) const override;

 private:
  friend class TierClient;
  TierClient* client_ = nullptr;
  std::shared_ptr<tier_shm::ShmRegion> region_;
  uint64_t session_ = 0;
  int64_t slot_bytes_ = 0;
  int64_t block_bytes_ = 0;
  std::vector<uint32_t> slots_;
  std::vector<uint64_t> checksums_;
  std::vector<tier_shm::TierKind> sources_;
};

class TierClient final : public TierLink {
 public:
  // Starts the client thread, which attaches (and keeps re-attaching while tierd is down).
  // InvalidArgument for a bad config; never fails because tierd is unreachable.
  static absl::StatusOr<std::unique_ptr<TierClient>> Start(TierClientConfig config);
  // Stops the thread; pending Prepare calls get nullptr; detaches.
  ~TierClient() override;

  TierClient(const TierClient&) = delete;
  TierClient& operator=(const TierClient&) = delete;

  // Offers an evicted block: `fill` writes it into an unbound DRAM slot when one is reserved,
  // else into a staging buffer the client thread offers later. Never blocks on tierd.
  void Offer(const BlockHash& hash, BlockFill fill) override;
  // The same for bytes in host memory (block_bytes long, else dropped).
  void Offer(const BlockHash& hash, absl::Span<const uint8_t> block);
  // `recompute_seconds_per_block` (0 = unknown) is the worker's measured cost of computing one
  // block: tierd fetches blocks from other nodes only while that is faster
  // (PromoteRequest.recompute_seconds_per_block).
  // Answers on the client thread.
  void Prepare(std::vector<BlockHash> chain, PrepareDone done,
               double recompute_seconds_per_block) override;
  void Release(const PromotedRun& run) override;

  // Blocks until the client is attached or `timeout` passes (tests, startup logs).
  bool WaitAttached(absl::Duration timeout);
  // Blocks until every offer and release queued so far was sent, or `timeout` passed (a
  // drained worker, before it hands its streams over); whether they were. True at once when
  // detached (nothing can be sent).
  bool FlushOffers(absl::Duration timeout);
  // FlushOffers without a timeout (tests).
  void FlushOffersForTest();
  // Blocks until `done` holds for the client's statistics or `timeout` passes; returns whether
  // it held (tests). `done` runs under the client's lock: it must only read its argument.
  bool AwaitStatsForTest(absl::FunctionRef<bool(const TierLinkStats&)> done,
                         absl::Duration timeout);

  TierLinkStats Stats() const override;

 private:
  struct Staged {
    BlockHash hash;
    std::vector<uint8_t> bytes;
  };
  struct PrepareJob {
    std::vector<BlockHash> chain;
    PrepareDone done;
    double recompute_seconds_per_block = 0;
  };
  struct Releases {
    uint64_t session = 0;
    std::vector<uint32_t> slots;
  };
  struct Unbound {  // a reserved slot not yet filled
    uint64_t session = 0;
    uint32_t slot = 0;
    absl::Time granted;
  };
  struct Filled {  // an unbound slot filled by Offer, to commit
    uint64_t session = 0;
    uint32_t slot = 0;
    BlockHash hash;
  };

  friend class ShmPromotedRun;  // counts checksum failures

  explicit TierClient(TierClientConfig config);
  void Loop();
  bool Attach();
  // Sends every job's Promote at once and answers each as its reply comes.
  void RunPrepares(std::vector<PrepareJob> jobs);
  void FinishPrepare(PrepareJob job, std::shared_ptr<ShmPromotedRun> run, const grpc::Status& s,
                     const pdserve::internal::v1::PromoteResponse& resp);
  void RunOffers(std::vector<Staged> batch);
  void RunReleases(std::vector<Releases> releases);
  void RunCommits(std::vector<Filled> filled);
  void RunReserve(int64_t count);
  // Unbound slots of an older session, or too close to their lease's end to be filled safely,
  // are dropped (and released when still this session's).
  void DropStaleUnboundLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // How many unbound slots to keep: config_.unbound_slots, at most num_slots_ / 8.
  int64_t UnboundTargetLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Counts a failed call; FAILED_PRECONDITION (unknown session) or UNAVAILABLE detaches.
  void OnRpcFailure(const grpc::Status& status, absl::string_view what);
  void CountChecksumFailure();
  TierLinkStats StatsLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const TierClientConfig config_;
  std::unique_ptr<pdserve::internal::v1::TierService::Stub> stub_;

  mutable absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool attached_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t session_ ABSL_GUARDED_BY(mu_) = 0;
  std::shared_ptr<tier_shm::ShmRegion> region_ ABSL_GUARDED_BY(mu_);
  int64_t num_slots_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t slot_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Duration lease_ ABSL_GUARDED_BY(mu_) = absl::Seconds(30);
  std::deque<Unbound> unbound_ ABSL_GUARDED_BY(mu_);
  std::vector<Filled> filled_ ABSL_GUARDED_BY(mu_);
  absl::Time next_reserve_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();  // refill backoff
  std::deque<PrepareJob> prepares_ ABSL_GUARDED_BY(mu_);
  std::deque<Staged> staged_ ABSL_GUARDED_BY(mu_);
  std::vector<Releases> releases_ ABSL_GUARDED_BY(mu_);
  // A batch of offers, commits or releases is being sent right now.
  bool sending_ ABSL_GUARDED_BY(mu_) = false;
  TierLinkStats stats_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

}  // namespace pd::tier_client
