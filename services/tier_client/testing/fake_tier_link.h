// FakeTierLink: an in-memory TierLink for unit tests of the worker's tier paths (no pd-tierd,
// no shared memory, no gRPC). Offered blocks are kept by hash with their checksum; Prepare
// answers the leading run of the chain it holds, at once, on the calling thread; runs verify
// with the real block checksum (services/tier_shm), so a block damaged after it was stored
// (CorruptForTest, like a stray write into tierd's shared memory) fails Verify as it would in
// production. Statistics follow TierLinkStats; the fake is always "attached".
//
// Ownership: runs point back to the link for counting: the link must outlive its runs.
// Thread-safety: thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "common/hash/block_hash.h"
#include "services/tier_client/tier_link.h"

namespace pd::tier_client {

class FakeTierLink final : public TierLink {
 public:
  // `block_bytes` (> 0) is the size every offered block has (the worker's KV layout).
  explicit FakeTierLink(int64_t block_bytes);

  void Offer(const BlockHash& hash, BlockFill fill) override;
  void Prepare(std::vector<BlockHash> chain, PrepareDone done,
               double recompute_seconds_per_block) override;
  void Release(const PromotedRun& run) override;
  TierLinkStats Stats() const override;

  // Whether the link holds `hash`.
  bool Holds(const BlockHash& hash) const;
  // Damages the held block `hash` (flips a bit in every 4-byte word), keeping its recorded
  // checksum (runs already holding it see the change too, as mappings of one slot do). false
  // when not held.
  bool CorruptForTest(const BlockHash& hash);
  // Runs Prepare handed out that were not released yet.
  int64_t UnreleasedRunsForTest() const;

 private:
  class Run;
  struct Block {
    std::shared_ptr<std::vector<uint8_t>> bytes;
    uint64_t checksum = 0;
  };

  void CountChecksumFailure();

  const int64_t block_bytes_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<BlockHash, Block> blocks_ ABSL_GUARDED_BY(mu_);
  int64_t unreleased_runs_ ABSL_GUARDED_BY(mu_) = 0;
  TierLinkStats stats_ ABSL_GUARDED_BY(mu_);
};

}  // namespace pd::tier_client
