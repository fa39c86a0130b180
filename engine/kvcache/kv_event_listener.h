// KvEventListener: what a KV block pool reports about its cached blocks, so that the worker can
// publish KV events (proto pd.v1 KV events) and the router can keep its index of which worker
// holds which block. Only hashed blocks (full, computed and committed) are reported; a block
// that was never committed is invisible to the cluster.
//
// Ordering: events are delivered in the order the pool's state changed. Replaying them on an
// empty set of hashes (Stored adds, Removed erases, AllCleared empties) yields exactly the set
// of hashes the pool can currently hit (BlockPool::Lookup), in use or evictable.
//
// Thread-safety: callbacks run synchronously on the thread calling into the pool (the
// scheduler thread), inside the pool operation that caused them. Implementations must be quick
// and must not call back into the pool or its KvCacheManager; a publisher copies the hashes
// and queues them.
#pragma once

#include <optional>

#include "absl/types/span.h"
#include "common/hash/block_hash.h"

namespace pd::kvcache {

class KvEventListener {
 public:
  virtual ~KvEventListener() = default;

  // `hashes` became cached (prefix-cache hits) in this pool; they are consecutive blocks of one
  // hash chain, in chain order. `parent` is the hash of the chain block just before hashes[0],
  // or nullopt when hashes[0] is the chain's first block. Never called with empty `hashes`.
  virtual void OnBlocksStored(absl::Span<const BlockHash> hashes,
                              std::optional<BlockHash> parent) = 0;

  // `hashes` are no longer cached here (evicted for reuse), in eviction order. Never empty.
  virtual void OnBlocksRemoved(absl::Span<const BlockHash> hashes) = 0;

  // Every cached hash was dropped at once (BlockPool::ResetPrefixCache).
  virtual void OnAllCleared() = 0;
};

}  // namespace pd::kvcache
