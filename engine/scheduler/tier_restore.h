// Restoring a prompt's blocks from the node's lower tiers (GenerationRequest::tier_prefix,
// pd-tierd's DRAM/NVMe) into the KV pool at a request's first admission. Plain function over a
// KvCacheManager; the scheduler's thread.
#pragma once

#include <cstdint>

#include "absl/types/span.h"
#include "common/hash/block_hash.h"
#include "engine/kvcache/kv_cache_manager.h"
#include "engine/scheduler/request.h"

namespace pd::engine {

struct TierRestoreResult {
  int64_t restored_blocks = 0;  // blocks copied in and committed as prefix-cache hits
  bool copy_failed = false;     // a copy_in failed its check; the restore stopped there
};

// Copies the blocks of `tier` that continue the pool's cached prefix of `chain` (the
// scheduler's hashes of the prompt's full blocks) into fresh pool blocks and commits them as
// prefix-cache hits: they are evictable, no sequence holds them afterwards. Only blocks wholly
// before the last of the prompt's `num_tokens` tokens (that token's block is always computed)
// and whose tier hash equals `chain`'s at that index are used. `scratch` is an unused sequence
// id, taken while the blocks are filled and freed before returning. Nothing is restored when
// nothing continues the cached prefix or the pool has no room. Does not release `tier`.
TierRestoreResult RestoreFromTiers(kvcache::KvCacheManager* kv, kvcache::SequenceId scratch,
                                   const TierPrefix& tier, absl::Span<const BlockHash> chain,
                                   int64_t num_tokens);

}  // namespace pd::engine
