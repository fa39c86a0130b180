#include "engine/kvcache/kv_cache_manager.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/log/log.h"

namespace pd::kvcache {

absl::Status KvCacheConfig::Validate() const {
  if (num_blocks < 1 || num_blocks > BlockPool::kMaxBlocks) {
    return absl::InvalidArgumentError(absl::StrCat("kv cache: num_blocks must be in [1, ",
                                                   BlockPool::kMaxBlocks, "], got ", num_blocks));
  }
  if (block_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("kv cache: block_size must be positive, got ", block_size));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<KvCacheManager>> KvCacheManager::Create(
    const KvCacheConfig& config, KvEventListener* listener, BlockPool::EvictionHook eviction_hook,
    BlockPool::StoreHook store_hook) {
  PD_RETURN_IF_ERROR(config.Validate());
  return std::unique_ptr<KvCacheManager>(
      new KvCacheManager(config, listener, std::move(eviction_hook), std::move(store_hook)));
}

KvCacheManager::KvCacheManager(const KvCacheConfig& config, KvEventListener* listener,
                               BlockPool::EvictionHook eviction_hook,
                               BlockPool::StoreHook store_hook)
    : block_size_(config.block_size),
      pool_(config.num_blocks, listener, std::move(eviction_hook), std::move(store_hook)) {}

int64_t KvCacheManager::NumBlocksForTokens(int64_t num_tokens) const {
  return (num_tokens + block_size_ - 1) / block_size_;
}

absl::StatusOr<BlockTable*> KvCacheManager::FindTable(SequenceId seq) {
  auto it = tables_.find(seq);
  if (it == tables_.end()) {
    return absl::NotFoundError(absl::StrCat("kv cache: unknown sequence ", seq.ToString()));
  }
  return &it->second;
}

absl::StatusOr<const BlockTable*> KvCacheManager::FindTable(SequenceId seq) const {
  auto it = tables_.find(seq);
  if (it == tables_.end()) {
    return absl::NotFoundError(absl::StrCat("kv cache: unknown sequence ", seq.ToString()));
  }
  return &it->second;
}

const BlockTable* KvCacheManager::GetTable(SequenceId seq) const {
  auto it = tables_.find(seq);
  return it == tables_.end() ? nullptr : &it->second;
}

void KvCacheManager::ForEachSequence(
    absl::FunctionRef<void(SequenceId, const BlockTable&)> fn) const {
  for (const auto& [seq, table] : tables_) {
    fn(seq, table);
  }
}

absl::Status KvCacheManager::ValidatePrompt(SequenceId seq, absl::Span<const BlockHash> chain,
                                            int64_t num_prompt_tokens) const {
  if (!seq.valid()) {
    return absl::InvalidArgumentError("kv cache: invalid sequence id");
  }
  if (num_prompt_tokens <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("kv cache: sequence ", seq.ToString(), " has ",
                                                   num_prompt_tokens, " prompt tokens"));
  }
  const int64_t num_full_blocks = num_prompt_tokens / block_size_;
  if (static_cast<int64_t>(chain.size()) > num_full_blocks) {
    return absl::InvalidArgumentError(absl::StrCat(
        "kv cache: sequence ", seq.ToString(), " has ", chain.size(), " block hashes but only ",
        num_full_blocks, " full blocks in ", num_prompt_tokens, " tokens"));
  }
  if (tables_.contains(seq)) {
    return absl::AlreadyExistsError(
        absl::StrCat("kv cache: sequence ", seq.ToString(), " is already allocated"));
  }
  return absl::OkStatus();
}

absl::StatusOr<int64_t> KvCacheManager::AllocatePrompt(SequenceId seq,
                                                       absl::Span<const BlockHash> chain,
                                                       int64_t num_prompt_tokens) {
  PD_RETURN_IF_ERROR(ValidatePrompt(seq, chain, num_prompt_tokens));
  // Leave at least one token to compute, in a block of its own (see header).
  const int64_t max_hits =
      std::min<int64_t>(static_cast<int64_t>(chain.size()), (num_prompt_tokens - 1) / block_size_);
  std::vector<BlockId> blocks;
  blocks.reserve(NumBlocksForTokens(num_prompt_tokens));
  int64_t num_evictable_hits = 0;  // hits that currently count as allocatable
  for (int64_t i = 0; i < max_hits; ++i) {
    const BlockId id = pool_.Lookup(chain[i]);
    if (!id.valid()) {
      break;
    }
    num_evictable_hits += pool_.IsEvictable(id) ? 1 : 0;
    blocks.push_back(id);
  }
  const int64_t num_hits = static_cast<int64_t>(blocks.size());
  const int64_t num_fresh = NumBlocksForTokens(num_prompt_tokens) - num_hits;
  if (num_fresh > pool_.NumFreeBlocks() - num_evictable_hits) {
    ++counters_.allocation_failures;
    return absl::ResourceExhaustedError(absl::StrCat(
        "kv cache: sequence ", seq.ToString(), " needs ", num_fresh, " new blocks (",
        num_prompt_tokens, " tokens, ", num_hits, " cached blocks), only ",
        pool_.NumFreeBlocks() - num_evictable_hits, " of ", pool_.num_blocks(), " allocatable"));
  }
  // Acquire hits before allocating, so that allocation cannot evict them.
  for (BlockId id : blocks) {
    pool_.AcquireCached(id);
  }
  const absl::Status allocated = pool_.Allocate(num_fresh, &blocks);
  CHECK(allocated.ok()) << allocated;  // checked above

  BlockTable& table = tables_[seq];
  table.blocks_ = std::move(blocks);
  table.num_tokens_ = num_prompt_tokens;
  table.num_committed_blocks_ = num_hits;
  table.num_cached_blocks_ = num_hits;

  ++counters_.prefix_queries;
  counters_.prefix_query_tokens += num_prompt_tokens;
  counters_.prefix_hit_blocks += num_hits;
  counters_.prefix_hit_tokens += num_hits * block_size_;
  VLOG(1) << "kv cache: sequence " << seq << " prompt_tokens=" << num_prompt_tokens
          << " cached_blocks=" << num_hits << " new_blocks=" << num_fresh;
  return num_hits * block_size_;
}

absl::StatusOr<ImportTarget> KvCacheManager::ImportBlocks(SequenceId seq,
                                                          absl::Span<const BlockHash> chain,
                                                          int64_t num_prompt_tokens) {
  ImportTarget target;
  PD_ASSIGN_OR_RETURN(target.num_cached_tokens, AllocatePrompt(seq, chain, num_prompt_tokens));
  const BlockTable* table = GetTable(seq);
  CHECK(table != nullptr);  // just allocated
  target.first_block = target.num_cached_tokens / block_size_;
  target.block_ids.assign(table->blocks_.begin() + target.first_block, table->blocks_.end());
  return target;
}

absl::StatusOr<ImportTarget> KvCacheManager::ImportCompressedBlocks(SequenceId seq,
                                                                    int64_t num_kept_tokens) {
  PD_ASSIGN_OR_RETURN(ImportTarget target, ImportBlocks(seq, {}, num_kept_tokens));
  tables_[seq].windowed_ = true;
  return target;
}

absl::StatusOr<int64_t> KvCacheManager::BlocksNeededToAppend(SequenceId seq,
                                                             int64_t num_tokens) const {
  PD_ASSIGN_OR_RETURN(const BlockTable* table, FindTable(seq));
  return std::max<int64_t>(
      0, NumBlocksForTokens(table->num_tokens_ + num_tokens) - table->num_blocks());
}

absl::Status KvCacheManager::AppendTokens(SequenceId seq, int64_t num_tokens) {
  if (num_tokens < 0) {
    return absl::InvalidArgumentError(absl::StrCat("kv cache: sequence ", seq.ToString(),
                                                   " cannot append ", num_tokens, " tokens"));
  }
  PD_ASSIGN_OR_RETURN(BlockTable * table, FindTable(seq));
  const int64_t needed = NumBlocksForTokens(table->num_tokens_ + num_tokens) - table->num_blocks();
  if (needed > 0) {
    absl::Status status = pool_.Allocate(needed, &table->blocks_);
    if (!status.ok()) {
      if (absl::IsResourceExhausted(status)) {
        ++counters_.allocation_failures;
      }
      return absl::Status(status.code(),
                          absl::StrCat(status.message(), " (sequence ", seq.ToString(),
                                       " appending ", num_tokens, " tokens)"));
    }
  }
  table->num_tokens_ += num_tokens;
  return absl::OkStatus();
}

absl::Status KvCacheManager::CommitBlocks(SequenceId seq, absl::Span<const BlockHash> chain) {
  PD_ASSIGN_OR_RETURN(BlockTable * table, FindTable(seq));
  if (table->windowed_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "kv cache: sequence ", seq.ToString(), " dropped or forked blocks; it commits no more"));
  }
  const int64_t num_hashes = static_cast<int64_t>(chain.size());
  const int64_t num_full_blocks = table->num_tokens_ / block_size_;
  if (num_hashes > num_full_blocks) {
    return absl::InvalidArgumentError(absl::StrCat("kv cache: sequence ", seq.ToString(),
                                                   " commits ", num_hashes, " blocks but has only ",
                                                   num_full_blocks, " full blocks"));
  }
  const int64_t begin = table->num_committed_blocks_;
  if (num_hashes <= begin) {
    return absl::OkStatus();
  }
  const absl::Span<const BlockId> blocks =
      absl::MakeConstSpan(table->blocks_).subspan(begin, num_hashes - begin);
  std::optional<BlockHash> parent;
  if (begin > 0) {
    parent = chain[begin - 1];
  }
  PD_RETURN_IF_ERROR(pool_.Commit(blocks, chain.subspan(begin), parent));
  table->num_committed_blocks_ = num_hashes;
  return absl::OkStatus();
}

absl::Status KvCacheManager::Free(SequenceId seq) {
  auto it = tables_.find(seq);
  if (it == tables_.end()) {
    return absl::NotFoundError(absl::StrCat("kv cache: unknown sequence ", seq.ToString()));
  }
  for (const std::vector<BlockId>* blocks : {&it->second.blocks_, &it->second.set_aside_}) {
    for (auto block = blocks->rbegin(); block != blocks->rend(); ++block) {
      pool_.Release(*block);
    }
  }
  tables_.erase(it);
  return absl::OkStatus();
}

absl::StatusOr<std::vector<BlockId>> KvCacheManager::ForkLeadingBlocks(SequenceId seq,
                                                                       int64_t num_blocks) {
  PD_ASSIGN_OR_RETURN(BlockTable * table, FindTable(seq));
  if (num_blocks <= 0 || num_blocks >= table->num_blocks() ||
      num_blocks * block_size_ > table->num_tokens_ || !table->set_aside_.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("kv cache: sequence ", seq.ToString(), " cannot fork its first ", num_blocks,
                     " blocks (it has ", table->num_blocks(), " blocks, ", table->num_tokens_,
                     " tokens", table->set_aside_.empty() ? "" : ", and forked before", ")"));
  }
  std::vector<BlockId> fresh;
  absl::Status status = pool_.Allocate(num_blocks, &fresh);
  if (!status.ok()) {
    if (absl::IsResourceExhausted(status)) {
      ++counters_.allocation_failures;
    }
    return absl::Status(status.code(), absl::StrCat(status.message(), " (sequence ", seq.ToString(),
                                                    " forking ", num_blocks, " blocks)"));
  }
  table->set_aside_.assign(table->blocks_.begin(), table->blocks_.begin() + num_blocks);
  std::copy(fresh.begin(), fresh.end(), table->blocks_.begin());
  table->windowed_ = true;
  table->num_committed_blocks_ = 0;
  table->num_cached_blocks_ = 0;
  return fresh;
}

absl::Status KvCacheManager::DropBlock(SequenceId seq, int64_t index) {
  PD_ASSIGN_OR_RETURN(BlockTable * table, FindTable(seq));
  if (index < 0 || index >= table->num_blocks() - 1 ||
      (index + 1) * block_size_ > table->num_tokens_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "kv cache: sequence ", seq.ToString(), " cannot drop block ", index, " (it has ",
        table->num_blocks(), " blocks, ", table->num_tokens_, " tokens; the last is kept)"));
  }
  const BlockId block = table->blocks_[static_cast<size_t>(index)];
  table->blocks_.erase(table->blocks_.begin() + index);
  table->num_tokens_ -= block_size_;
  table->windowed_ = true;
  table->num_committed_blocks_ = std::min(table->num_committed_blocks_, index);
  table->num_cached_blocks_ = std::min(table->num_cached_blocks_, index);
  pool_.Release(block);
  return absl::OkStatus();
}

absl::Status KvCacheManager::ReplaceBlocks(SequenceId seq, int64_t num_tokens, BlockFiller fill) {
  PD_ASSIGN_OR_RETURN(BlockTable * table, FindTable(seq));
  if (num_tokens <= 0 || num_tokens > table->num_tokens_ || !table->set_aside_.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("kv cache: sequence ", seq.ToString(), " cannot keep ", num_tokens, " of its ",
                     table->num_tokens_, " tokens in fresh blocks",
                     table->set_aside_.empty() ? "" : " (blocks are set aside)"));
  }
  std::vector<BlockId> fresh;
  absl::Status status = pool_.Allocate(NumBlocksForTokens(num_tokens), &fresh);
  if (!status.ok()) {
    if (absl::IsResourceExhausted(status)) {
      ++counters_.allocation_failures;
    }
    return absl::Status(status.code(), absl::StrCat(status.message(), " (sequence ", seq.ToString(),
                                                    " compacting into ",
                                                    NumBlocksForTokens(num_tokens), " blocks)"));
  }
  absl::Status filled = fill(table->blocks_, fresh);
  if (!filled.ok()) {
    for (BlockId b : fresh) pool_.Release(b);
    return filled;
  }
  std::vector<BlockId> old = std::move(table->blocks_);
  table->blocks_ = std::move(fresh);
  table->num_tokens_ = num_tokens;
  table->windowed_ = true;
  table->num_committed_blocks_ = 0;
  table->num_cached_blocks_ = 0;
  for (auto it = old.rbegin(); it != old.rend(); ++it) pool_.Release(*it);
  return absl::OkStatus();
}

absl::StatusOr<std::vector<BlockId>> KvCacheManager::ExportBlocks(SequenceId seq,
                                                                  int64_t first_block,
                                                                  int64_t num_blocks) const {
  PD_ASSIGN_OR_RETURN(const BlockTable* table, FindTable(seq));
  if (first_block < 0 || num_blocks < 0 || first_block > table->num_blocks() - num_blocks) {
    return absl::OutOfRangeError(absl::StrCat(
        "kv cache: blocks [", first_block, ", ", first_block + num_blocks, ") of sequence ",
        seq.ToString(), " which has ", table->num_blocks(), " blocks"));
  }
  return std::vector<BlockId>(table->blocks_.begin() + first_block,
                              table->blocks_.begin() + first_block + num_blocks);
}

KvCacheStats KvCacheManager::Stats() const {
  KvCacheStats stats = counters_;
  stats.num_blocks_total = pool_.num_blocks();
  stats.num_blocks_free = pool_.NumUnhashedFreeBlocks();
  stats.num_blocks_cached = pool_.NumEvictableBlocks();
  stats.num_blocks_used = pool_.NumUsedBlocks();
  stats.num_cached_hashes = pool_.NumCachedHashes();
  stats.num_sequences = num_sequences();
  stats.evictions = pool_.num_evictions();
  return stats;
}

}  // namespace pd::kvcache
