#include "engine/scheduler/tier_restore.h"

#include <algorithm>
#include <vector>

#include "common/log/log.h"

namespace pd::engine {

TierRestoreResult RestoreFromTiers(kvcache::KvCacheManager* kv, kvcache::SequenceId scratch,
                                   const TierPrefix& tier, absl::Span<const BlockHash> chain,
                                   int64_t num_tokens) {
  const int64_t block_size = kv->block_size();
  const int64_t local = kv->Match(chain);
  // Blocks wholly before the last prompt token: that token's block is always computed.
  int64_t end =
      std::min<int64_t>({tier.first_block + static_cast<int64_t>(tier.chain.size()),
                         static_cast<int64_t>(chain.size()), (num_tokens - 1) / block_size});
  for (int64_t i = std::max(local, tier.first_block); i < end; ++i) {
    if (tier.chain[static_cast<size_t>(i - tier.first_block)] != chain[static_cast<size_t>(i)]) {
      end = i;  // not this prompt's block (another salt or model): never use it
      break;
    }
  }
  TierRestoreResult result;
  if (local < tier.first_block || local >= end) {
    return result;
  }
  // The scratch sequence takes references on the cached prefix (so allocating the fresh
  // blocks cannot evict it) and owns the fresh blocks while they are filled.
  absl::StatusOr<int64_t> cached =
      kv->AllocatePrompt(scratch, chain.first(static_cast<size_t>(end)), end * block_size + 1);
  if (!cached.ok()) {
    return result;  // (a failed AllocatePrompt changed nothing: no room, compute instead)
  }
  if (*cached == local * block_size) {
    absl::StatusOr<std::vector<BlockId>> ids = kv->ExportBlocks(scratch, local, end - local);
    CHECK(ids.ok()) << ids.status();
    int64_t k = local;
    while (k < end && tier.copy_in(k, (*ids)[static_cast<size_t>(k - local)])) {
      ++k;
    }
    result.copy_failed = k < end;
    if (k > local) {
      absl::Status commit = kv->CommitBlocks(scratch, chain.first(static_cast<size_t>(k)));
      CHECK(commit.ok()) << commit;  // fresh blocks of this chain
    }
    result.restored_blocks = k - local;
  }
  absl::Status freed = kv->Free(scratch);
  CHECK(freed.ok()) << freed;
  return result;
}

}  // namespace pd::engine
