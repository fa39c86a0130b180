// TierLink: the worker's view of its node's lower tiers (pd-tierd's DRAM and NVMe): what the
// worker's request path calls, and nothing else. The real implementation is TierClient
// (tier_client.h, gRPC + the shared DRAM pool); testing/ has an in-memory fake
// (FakeTierLink) and a fault-injecting decorator (FaultInjectingTierLink), so the worker's
// tier paths are unit-tested without a pd-tierd (as KvTransport has a loopback fake and
// FaultInjectingTransport).
//
//   Offer(hash, fill)     scheduler thread, inside the pool's eviction (or write-through): the
//                         link copies the block (fill writes block_bytes bytes) before it
//                         returns and offers it later. Never blocks on tierd; a refused or
//                         dropped offer is only counted.
//   Prepare(chain, done)  any thread: asks the tiers for the chain's leading blocks and calls
//                         `done` exactly once with a PromotedRun of the blocks they pinned (a
//                         prefix of the chain), or nullptr when they hold none or cannot be
//                         reached. `done` may run on the calling thread or the link's own.
//   Release(run)          unpins a run `done` received from this link (exactly once per run).
//
// Failure never fails a request: tierd down means Prepare answers nullptr and offers are
// dropped; a block whose bytes changed after it was pinned fails PromotedRun::Verify (the
// caller stops restoring there and computes the rest).
//
// Thread-safety: implementations are thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/functional/any_invocable.h"
#include "absl/functional/function_ref.h"
#include "common/hash/block_hash.h"
#include "services/tier_shm/tier_kind.h"

namespace pd::tier_client {

// Counters of a link (the worker turns them into pd_worker_tier* metrics). Gauges are current
// values; *_total count since the link started.
struct TierLinkStats {
  bool attached = false;
  uint64_t attaches_total = 0;
  uint64_t rpc_failures_total = 0;             // failed calls (tierd down, timeouts, refusals)
  uint64_t offered_blocks_total = 0;           // sent to AllocateSlots
  uint64_t offer_stored_blocks_total = 0;      // committed into DRAM
  uint64_t offer_skipped_blocks_total = 0;     // the node already had them
  uint64_t offer_dropped_blocks_total = 0;     // no slot, staging full, tierd down, bad commit
  uint64_t offered_in_place_blocks_total = 0;  // of the offers, copied straight into a slot
  int64_t unbound_slots_held = 0;              // reserved slots ready for in-place offers now
  uint64_t prepares_total = 0;                 // Prepare calls answered
  uint64_t promoted_blocks_total = 0;          // blocks made readable by Promote
  uint64_t promoted_from_nvme_total = 0;       // of those, read from NVMe by tierd
  uint64_t checksum_failures_total = 0;        // copies of promoted blocks that failed Verify
  bool node_mismatch = false;                  // the attached tierd names another node
};

// Blocks of one chain pinned in the tiers for this worker, in chain order. Keeps whatever
// backs the bytes (the shared-memory mapping) alive while it lives. Thread-safe (immutable; a
// failed verification is counted by the link that made the run).
class PromotedRun {
 public:
  virtual ~PromotedRun() = default;

  virtual size_t size() const = 0;
  virtual int64_t block_bytes() const = 0;
  virtual tier_shm::TierKind source(size_t k) const = 0;
  // Copies block k into `dst` (block_bytes bytes) and verifies the copy against the checksum
  // tierd recorded. false when it does not match (the slot was reused after its lease, or
  // damaged); counted.
  virtual bool CopyOut(size_t k, uint8_t* dst) const = 0;
  // For a copy the caller makes itself (a device pool: cudaMemcpyAsync straight from shared
  // memory): block k's bytes, block_bytes() long, valid while the run lives. Call Verify(k)
  // after the copy.
  virtual const uint8_t* BlockBytes(size_t k) const = 0;
  // Whether block k's bytes hash to tierd's checksum now (false is counted, as CopyOut's).
  // Checked after the copy, it catches a slot reused during the copy.
  virtual bool Verify(size_t k) const = 0;
};

class TierLink {
 public:
  using PrepareDone = absl::AnyInvocable<void(std::shared_ptr<const PromotedRun>)>;
  // Writes an evicted block's block_bytes bytes to `dst`; false: the block could not be read
  // (nothing is offered).
  using BlockFill = absl::FunctionRef<bool(uint8_t* dst)>;

  virtual ~TierLink() = default;

  // Offers an evicted block; `fill` is called before Offer returns, on the caller's thread.
  virtual void Offer(const BlockHash& hash, BlockFill fill) = 0;
  // `recompute_seconds_per_block` (0 = unknown) is the worker's measured cost of computing one
  // block: tierd fetches blocks from other nodes only while that is faster.
  virtual void Prepare(std::vector<BlockHash> chain, PrepareDone done,
                       double recompute_seconds_per_block) = 0;
  // `run` must be one this link's Prepare answered.
  virtual void Release(const PromotedRun& run) = 0;

  virtual TierLinkStats Stats() const = 0;
};

}  // namespace pd::tier_client
