// BlockTable: one sequence's view of the KV pool. Logical block i of the sequence (its tokens
// [i * block_size, (i + 1) * block_size)) lives in physical block blocks()[i]; the attention
// kernels read it through this mapping.
//
// Tables are created and changed only by KvCacheManager, which keeps them consistent with the
// BlockPool's reference counts; everyone else reads them.
//
// Thread-safety: thread-compatible value type.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/types/span.h"
#include "common/base/strong_id.h"

namespace pd::kvcache {

// Names one sequence in a KvCacheManager (a request, or one branch of a request later).
using SequenceId = StrongId<struct SequenceIdTag, uint64_t>;

class BlockTable {
 public:
  // Physical block of each logical block; size() == ceil(num_tokens() / block_size).
  absl::Span<const BlockId> blocks() const { return blocks_; }
  int64_t num_blocks() const { return static_cast<int64_t>(blocks_.size()); }
  // Tokens whose KV slots are allocated (prompt plus appended tokens).
  int64_t num_tokens() const { return num_tokens_; }
  // Leading blocks already committed (hashed, or found to duplicate a cached block) or taken
  // from the prefix cache; CommitBlocks resumes after them.
  int64_t num_committed_blocks() const { return num_committed_blocks_; }
  // Leading blocks that were prefix-cache hits when the prompt was allocated.
  int64_t num_cached_blocks() const { return num_cached_blocks_; }
  // Sink + window KV policy (KvCacheManager::ForkLeadingBlocks, DropBlock): once a block was
  // dropped or forked the table no longer maps logical block i to tokens [i * block_size, ...)
  // of the text, and nothing more of it is committed to the prefix cache.
  bool windowed() const { return windowed_; }
  // Original leading blocks set aside by ForkLeadingBlocks (still referenced by this table).
  absl::Span<const BlockId> set_aside() const { return set_aside_; }

 private:
  friend class KvCacheManager;

  std::vector<BlockId> blocks_;
  int64_t num_tokens_ = 0;
  int64_t num_committed_blocks_ = 0;
  int64_t num_cached_blocks_ = 0;
  bool windowed_ = false;
  std::vector<BlockId> set_aside_;
};

}  // namespace pd::kvcache
