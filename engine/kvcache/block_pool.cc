#include "engine/kvcache/block_pool.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/log/log.h"

namespace pd::kvcache {

BlockPool::BlockPool(int64_t num_blocks, KvEventListener* listener, EvictionHook hook,
                     StoreHook store_hook)
    : listener_(listener), eviction_hook_(std::move(hook)), store_hook_(std::move(store_hook)) {
  CHECK(num_blocks >= 1 && num_blocks <= kMaxBlocks) << "num_blocks " << num_blocks;
  blocks_.resize(num_blocks);
  free_.reserve(num_blocks);
  // Free list is a stack popped from the back: push in reverse so block 0 is handed out first.
  for (int64_t i = num_blocks - 1; i >= 0; --i) {
    free_.push_back(BlockId(static_cast<uint32_t>(i)));
  }
}

const BlockPool::Block& BlockPool::Get(BlockId block) const {
  CHECK(block.valid() && block.value() < blocks_.size()) << "block " << block;
  return blocks_[block.value()];
}

BlockPool::Block& BlockPool::Get(BlockId block) {
  CHECK(block.valid() && block.value() < blocks_.size()) << "block " << block;
  return blocks_[block.value()];
}

void BlockPool::LinkLruBack(uint32_t index) {
  Block& b = blocks_[index];
  DCHECK(!b.evictable);
  b.lru_prev = lru_tail_;
  b.lru_next = kNil;
  if (lru_tail_ != kNil) {
    blocks_[lru_tail_].lru_next = index;
  } else {
    lru_head_ = index;
  }
  lru_tail_ = index;
  b.evictable = true;
  ++num_evictable_;
}

void BlockPool::UnlinkLru(uint32_t index) {
  Block& b = blocks_[index];
  DCHECK(b.evictable);
  if (b.lru_prev != kNil) {
    blocks_[b.lru_prev].lru_next = b.lru_next;
  } else {
    lru_head_ = b.lru_next;
  }
  if (b.lru_next != kNil) {
    blocks_[b.lru_next].lru_prev = b.lru_prev;
  } else {
    lru_tail_ = b.lru_prev;
  }
  b.lru_prev = b.lru_next = kNil;
  b.evictable = false;
  --num_evictable_;
}

BlockId BlockPool::Lookup(const BlockHash& hash) const {
  auto it = hash_to_block_.find(hash);
  return it == hash_to_block_.end() ? BlockId::Invalid() : it->second;
}

int64_t BlockPool::MatchPrefix(absl::Span<const BlockHash> chain) const {
  int64_t n = 0;
  while (n < static_cast<int64_t>(chain.size()) && hash_to_block_.contains(chain[n])) {
    ++n;
  }
  return n;
}

void BlockPool::AcquireCached(BlockId block) {
  Block& b = Get(block);
  CHECK(b.has_hash) << "block " << block << " is not cached";
  if (b.evictable) {
    UnlinkLru(block.value());
  }
  ++b.ref_count;
}

absl::Status BlockPool::Allocate(int64_t n, std::vector<BlockId>* out) {
  if (n < 0) {
    return absl::InvalidArgumentError(absl::StrCat("kv cache: cannot allocate ", n, " blocks"));
  }
  if (n > NumFreeBlocks()) {
    return absl::ResourceExhaustedError(
        absl::StrCat("kv cache: need ", n, " blocks, only ", NumFreeBlocks(), " of ", num_blocks(),
                     " allocatable (", free_.size(), " free, ", num_evictable_, " cached)"));
  }
  std::vector<BlockHash> evicted;
  out->reserve(out->size() + n);
  for (int64_t i = 0; i < n; ++i) {
    BlockId id;
    if (!free_.empty()) {
      id = free_.back();
      free_.pop_back();
    } else {
      const uint32_t index = lru_head_;
      DCHECK_NE(index, kNil);
      UnlinkLru(index);
      Block& b = blocks_[index];
      id = BlockId(index);
      // The hook sees the block while its contents still match its hash.
      if (eviction_hook_) {
        eviction_hook_(b.hash, id);
      }
      hash_to_block_.erase(b.hash);
      b.has_hash = false;
      evicted.push_back(b.hash);
      ++num_evictions_;
      VLOG(2) << "kv cache: evicted block " << id << " hash=" << b.hash.ToHex();
    }
    blocks_[id.value()].ref_count = 1;
    out->push_back(id);
  }
  if (listener_ != nullptr && !evicted.empty()) {
    listener_->OnBlocksRemoved(evicted);
  }
  return absl::OkStatus();
}

void BlockPool::Release(BlockId block) {
  Block& b = Get(block);
  CHECK_GT(b.ref_count, 0) << "block " << block << " released more often than acquired";
  if (--b.ref_count > 0) {
    return;
  }
  if (b.has_hash) {
    LinkLruBack(block.value());
  } else {
    free_.push_back(block);
  }
}

absl::Status BlockPool::Commit(absl::Span<const BlockId> blocks, absl::Span<const BlockHash> hashes,
                               std::optional<BlockHash> parent) {
  if (blocks.size() != hashes.size()) {
    return absl::InvalidArgumentError(absl::StrCat("kv cache: commit of ", blocks.size(),
                                                   " blocks with ", hashes.size(), " hashes"));
  }
  // Validate everything first so that a failure changes nothing.
  for (size_t i = 0; i < blocks.size(); ++i) {
    const BlockId id = blocks[i];
    if (!id.valid() || id.value() >= blocks_.size()) {
      return absl::FailedPreconditionError(
          absl::StrCat("kv cache: commit of unknown block ", id.ToString()));
    }
    const Block& b = blocks_[id.value()];
    if (b.ref_count == 0) {
      return absl::FailedPreconditionError(
          absl::StrCat("kv cache: commit of block ", id.ToString(), " which is not in use"));
    }
    if (b.has_hash && b.hash != hashes[i]) {
      return absl::FailedPreconditionError(absl::StrCat("kv cache: block ", id.ToString(),
                                                        " already holds hash ", b.hash.ToHex(),
                                                        ", cannot commit ", hashes[i].ToHex()));
    }
  }
  // Register, reporting each run of newly registered hashes as one OnBlocksStored.
  std::vector<size_t> stored;  // indexes newly registered, for the store hook
  size_t run_begin = 0;
  size_t run_end = 0;
  auto flush_run = [&] {
    if (listener_ != nullptr && run_end > run_begin) {
      std::optional<BlockHash> run_parent =
          run_begin == 0 ? parent : std::optional<BlockHash>(hashes[run_begin - 1]);
      listener_->OnBlocksStored(hashes.subspan(run_begin, run_end - run_begin), run_parent);
    }
  };
  for (size_t i = 0; i < blocks.size(); ++i) {
    Block& b = blocks_[blocks[i].value()];
    bool registered = false;
    if (!b.has_hash) {
      // try_emplace keeps an existing mapping: a duplicate stays unhashed (see header).
      registered = hash_to_block_.try_emplace(hashes[i], blocks[i]).second;
      if (registered) {
        b.hash = hashes[i];
        b.has_hash = true;
      }
    }
    if (registered) {
      if (store_hook_) {
        stored.push_back(i);
      }
      if (run_end != i) {
        flush_run();
        run_begin = i;
      }
      run_end = i + 1;
    }
  }
  flush_run();
  for (size_t i : stored) {
    store_hook_(hashes[i], blocks[i]);
  }
  return absl::OkStatus();
}

void BlockPool::ResetPrefixCache() {
  for (uint32_t i = 0; i < blocks_.size(); ++i) {
    Block& b = blocks_[i];
    if (!b.has_hash) {
      continue;
    }
    if (b.evictable) {
      UnlinkLru(i);
      free_.push_back(BlockId(i));
    }
    b.has_hash = false;
  }
  hash_to_block_.clear();
  if (listener_ != nullptr) {
    listener_->OnAllCleared();
  }
}

std::optional<BlockHash> BlockPool::hash(BlockId block) const {
  const Block& b = Get(block);
  return b.has_hash ? std::optional<BlockHash>(b.hash) : std::nullopt;
}

std::vector<BlockId> BlockPool::EvictableBlocksInLruOrder() const {
  std::vector<BlockId> order;
  order.reserve(num_evictable_);
  for (uint32_t i = lru_head_; i != kNil; i = blocks_[i].lru_next) {
    order.push_back(BlockId(i));
  }
  return order;
}

absl::Status BlockPool::CheckInvariants() const {
  auto fail = [](auto&&... args) { return absl::InternalError(absl::StrCat(args...)); };
  std::vector<uint8_t> on_free(blocks_.size(), 0);
  for (BlockId id : free_) {
    if (!id.valid() || id.value() >= blocks_.size()) {
      return fail("free list holds invalid block ", id.ToString());
    }
    if (on_free[id.value()]++ != 0) {
      return fail("block ", id.ToString(), " is on the free list twice");
    }
  }
  int64_t lru_len = 0;
  uint32_t prev = kNil;
  for (uint32_t i = lru_head_; i != kNil; i = blocks_[i].lru_next) {
    if (i >= blocks_.size() || ++lru_len > num_evictable_) {
      return fail("lru list is corrupt or longer than ", num_evictable_);
    }
    if (!blocks_[i].evictable || blocks_[i].lru_prev != prev) {
      return fail("lru list link broken at block ", i);
    }
    prev = i;
  }
  if (lru_len != num_evictable_ || prev != lru_tail_) {
    return fail("lru list has ", lru_len, " blocks, counter says ", num_evictable_);
  }
  int64_t num_hashed = 0;
  for (uint32_t i = 0; i < blocks_.size(); ++i) {
    const Block& b = blocks_[i];
    if (b.ref_count < 0) {
      return fail("block ", i, " has ref_count ", b.ref_count);
    }
    const bool is_free = on_free[i] != 0;
    const bool used = b.ref_count > 0;
    if (int{is_free} + int{b.evictable} + int{used} != 1) {
      return fail("block ", i, " is in ", int{is_free} + int{b.evictable} + int{used},
                  " states (free=", is_free, " evictable=", b.evictable, " ref=", b.ref_count, ")");
    }
    if (is_free && b.has_hash) {
      return fail("free block ", i, " carries a hash");
    }
    if (b.evictable && !b.has_hash) {
      return fail("evictable block ", i, " has no hash");
    }
    if (b.has_hash) {
      ++num_hashed;
      auto it = hash_to_block_.find(b.hash);
      if (it == hash_to_block_.end() || it->second != BlockId(i)) {
        return fail("block ", i, " hash ", b.hash.ToHex(), " is not mapped to it");
      }
    }
  }
  if (num_hashed != static_cast<int64_t>(hash_to_block_.size())) {
    return fail("hash map has ", hash_to_block_.size(), " entries, ", num_hashed,
                " blocks are hashed");
  }
  return absl::OkStatus();
}

}  // namespace pd::kvcache
