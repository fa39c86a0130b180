// KvHandoff: the engine's side of the prefill -> decode KV handoff
// (docs/architecture.md, "Request path", step 4): one KvTransport with the worker's block pool
// registered, cached connections to peers, and a completion thread that reports when transfers
// finish.
//
// Decode worker: Expect(tag, destination blocks) -> descriptor for the prefill worker; then
// WhenDone(expectation id) to learn that the bytes are in place (or Cancel on failure).
// Prefill worker: Send(decode endpoint, tag, block pairs, descriptor) -> WhenDone(transfer id).
//
// A pool with no single region (a tensor-parallel worker's per-rank pools, memory::TpKvPool)
// is registered staged (RegisterStagedPool): the transport moves blocks through a registered
// staging area in the TP = 1 layout, which Send fills from the ranks (KvPoolMemory::ReadBlock)
// and a finished expectation empties into them (WriteBlock) before its callback runs. So each
// block's head slices travel from the ranks that computed them to the ranks that read them
// whatever the TP sizes of the two sides, over any transport, in the layout the handshake
// checks (docs/engine.md, "Per-rank pools").
//
// Thread-safe. Completion callbacks run on the handoff's own thread, one at a time; they must
// be quick and must not call Wait on this handoff.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "engine/kvcache/kv_layout.h"
#include "engine/memory/kv_pool_memory.h"
#include "transport/kv_transport.h"
#include "transport/registry.h"

namespace pd::disagg {

struct KvHandoffConfig {
  transport::TransportConfig transport;
  // What the pool is: host memory, or (--device cuda) device memory of CUDA device
  // `cuda_device`. A backend that cannot register the kind refuses at Create.
  transport::MemoryKind memory_kind = transport::MemoryKind::kHost;
  int cuda_device = 0;
  absl::Duration transfer_timeout = absl::Seconds(30);  // default bound of one transfer
};

// The transport geometry of a pool: `fingerprint_hex` is the model fingerprint (its first 16
// hex digits become PoolGeometry::model_fingerprint). InvalidArgument for a bad layout or
// fingerprint.
absl::StatusOr<transport::PoolGeometry> GeometryFor(const kvcache::KvLayout& layout,
                                                    absl::string_view fingerprint_hex,
                                                    int64_t num_blocks);

class KvHandoff {
 public:
  using DoneCallback = std::function<void(const transport::TransferState&)>;

  // Creates the transport and registers [base, base + size_bytes) with `geometry`. Errors from
  // the registry (InvalidArgument, Unimplemented for an unbuilt backend) and from Register.
  static absl::StatusOr<std::unique_ptr<KvHandoff>> Create(const KvHandoffConfig& config,
                                                           void* base, uint64_t size_bytes,
                                                           const transport::PoolGeometry& geometry);
  // Creates the transport only, so that the pool can be allocated by it (PoolAllocator) before
  // RegisterPool. Nothing but PoolAllocator and RegisterPool may be called before RegisterPool.
  static absl::StatusOr<std::unique_ptr<KvHandoff>> CreateUnregistered(
      const KvHandoffConfig& config);
  // Registers the pool (of the config's memory_kind) once; FailedPrecondition when one is
  // registered already.
  absl::Status RegisterPool(void* base, uint64_t size_bytes,
                            const transport::PoolGeometry& geometry);
  // Registers `pool` (not owned; outlives the handoff) staged: a staging area of
  // `staging_blocks` blocks of geometry.block_bytes (from the transport's AllocateHost) is the
  // registered region, and transfers go through it (above). A transfer of more blocks than are
  // free there fails at Expect or Send with ResourceExhausted naming the numbers (the decode
  // worker then prefills locally). Every staged Expect and Send must be followed by WhenDone,
  // whose completion frees its staging blocks. FailedPrecondition when a pool is registered
  // already; InvalidArgument for staging_blocks < 1 or a pool whose block bytes differ.
  absl::Status RegisterStagedPool(memory::KvPoolMemory* pool, int64_t staging_blocks,
                                  const transport::PoolGeometry& geometry);
  bool staged() const { return staged_pool_ != nullptr; }
  // A staged pool's copies and refusals so far (metrics).
  struct StagingStats {
    int64_t blocks = 0;       // the staging area's size
    int64_t free_blocks = 0;  // free now
    int64_t blocks_out = 0;   // gathered from the pool into staging blocks (Send)
    int64_t blocks_in = 0;    // copied from staging blocks into the pool (expectations done)
    double seconds_out = 0;   // time those copies took
    double seconds_in = 0;
    int64_t refused = 0;  // transfers refused for want of free staging blocks
  };
  StagingStats staging_stats();

  // An allocator for a host pool's memory from the transport (KvTransport::AllocateHost) when
  // its Caps() say that is faster, else empty (allocate it anywhere; always for device pools). The memory may outlive this
  // handoff; the pool must stay until the handoff is destroyed (it deregisters then).
  std::function<absl::StatusOr<std::shared_ptr<transport::HostAllocation>>(uint64_t bytes)>
  PoolAllocator();
  // Stops the completion thread (pending callbacks get a Cancelled state) and deregisters.
  ~KvHandoff();
  KvHandoff(const KvHandoff&) = delete;
  KvHandoff& operator=(const KvHandoff&) = delete;

  absl::string_view backend() const { return transport_->Name(); }
  std::string endpoint() const { return transport_->LocalEndpoint(); }
  const transport::PoolGeometry& geometry() const { return geometry_; }
  transport::KvTransport* transport() { return transport_.get(); }

  // A tag unique among this handoff's transfers.
  uint64_t NextTag();

  // Decode side: announce that `dst` will be written by the transfer tagged `tag`. The sender
  // must name, as destinations, the blocks put in *wire_dst (when not null): `dst` itself, or
  // for a staged pool the staging blocks that stand for them.
  absl::StatusOr<transport::Expectation> Expect(uint64_t tag, absl::Span<const BlockId> dst,
                                                absl::Duration timeout,
                                                std::vector<BlockId>* wire_dst = nullptr);

  // Prefill side: connects to `peer_endpoint` unless already connected (may block for the
  // connection set-up; call it before Send on a thread that may wait).
  absl::Status EnsureConnected(absl::string_view peer_endpoint);

  // Prefill side: connect (once per endpoint) and post the write of `pairs`.
  absl::StatusOr<TransferId> Send(absl::string_view peer_endpoint, uint64_t tag,
                                  absl::Span<const transport::BlockPair> pairs,
                                  absl::string_view descriptor, absl::Duration timeout);

  // Calls `done` once the transfer or expectation `id` finished (or with DeadlineExceeded when
  // `deadline` passes first, after cancelling it).
  void WhenDone(TransferId id, absl::Time deadline, DoneCallback done);

  // Cancels a pending transfer or expectation; returns once no write into its blocks is in
  // progress (staged: nor a copy out of the staging area into them). OK when it already
  // finished.
  absl::Status Cancel(TransferId id);

 private:
  KvHandoff() = default;
  void RunCompletions();
  // A staged transfer or expectation: its staging blocks and (an expectation) the pool blocks
  // they stand for.
  struct Staged {
    std::vector<BlockId> slots;
    std::vector<BlockId> dst;
    bool cancelled = false;  // Cancel came first: nothing is copied into the pool
    bool copying = false;    // the completion thread is copying into the pool
  };
  absl::StatusOr<std::vector<BlockId>> TakeSlots(size_t n);
  void ReturnSlots(const std::vector<BlockId>& slots);
  // A staged id finished with `state`: an expectation done copies its blocks into the pool
  // (a failed copy fails the state); its slots are freed. No-op for ids not staged.
  void FinishStaged(TransferId id, transport::TransferState* state);
  absl::StatusOr<transport::PeerHandle> PeerFor(absl::string_view peer_endpoint);

  struct Pending {
    TransferId id;
    absl::Time deadline;
    DoneCallback done;
  };

  transport::PoolGeometry geometry_;
  std::unique_ptr<transport::KvTransport> transport_;
  transport::RegionHandle region_;
  bool registered_ = false;  // set once by RegisterPool, before any other use
  transport::MemoryKind memory_kind_ = transport::MemoryKind::kHost;  // of the pool
  int cuda_device_ = 0;
  absl::Mutex mu_;
  absl::flat_hash_map<std::string, transport::PeerHandle> peers_ ABSL_GUARDED_BY(mu_);
  std::vector<Pending> pending_ ABSL_GUARDED_BY(mu_);
  // Staged pools (RegisterStagedPool).
  memory::KvPoolMemory* staged_pool_ = nullptr;
  std::shared_ptr<transport::HostAllocation> staging_;
  std::vector<BlockId> free_slots_ ABSL_GUARDED_BY(mu_);
  StagingStats staging_stats_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, Staged> staged_ids_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t next_tag_ ABSL_GUARDED_BY(mu_) = 1;
  std::thread completions_;
};

}  // namespace pd::disagg
