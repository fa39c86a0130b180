// HostKvPool: the KV block pool's memory on the CPU backend (tier G1 of docs/architecture.md,
// "Tiers", when there is no GPU): one contiguous, page-aligned anonymous mapping of
// num_blocks * layout.block_bytes() bytes. Block b occupies
// [base() + b * block_bytes, base() + (b + 1) * block_bytes), laid out as KvLayout describes.
//
// The transport registers [base(), base() + size_bytes()) as one memory region, so the mapping
// never moves or grows. Which block holds what is decided by kvcache::KvCacheManager; this class
// only owns the bytes. New memory reads as zeros.
//
// Ownership: RAII; the mapping is released when the pool is destroyed, so it must outlive every
// registration of it and every pointer from BlockData().
// Thread-safety: immutable after Create(); its methods are safe to call concurrently. Access to
// the block contents is synchronised by the callers (the scheduler hands a block to one writer).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/base/strong_id.h"
#include "engine/kvcache/kv_layout.h"

namespace pd::memory {

// Pool memory obtained elsewhere, e.g. from the KV transport (KvTransport::AllocateHost) so that
// peers reach it fastest. `base` is 64-byte aligned, holds at least the pool's bytes and reads
// as zeros; `owner` keeps it alive until the pool is destroyed.
struct ExternalPoolMemory {
  uint8_t* base = nullptr;
  size_t size = 0;
  std::shared_ptr<void> owner;
  std::string description;  // for the start-up log, e.g. "ucx ucp_mem_map allocation"
};
using PoolMemoryAllocator = std::function<absl::StatusOr<ExternalPoolMemory>(size_t bytes)>;

struct HostKvPoolOptions {
  // Fault every page in at creation (MAP_POPULATE), so the first requests do not pay page
  // faults and a too-large pool fails at startup rather than under load.
  bool populate = false;
  // Ask for transparent huge pages (madvise MADV_HUGEPAGE) when the pool is at least one huge
  // page; silently skipped where the kernel does not allow it.
  bool huge_pages = true;
  // Where the bytes come from; empty = an anonymous mapping made here (then `populate` and
  // `huge_pages` apply; they do not to external memory).
  PoolMemoryAllocator allocator;
};

class HostKvPool {
 public:
  // Maps a pool of `num_blocks` blocks of `layout`.
  //   InvalidArgument    the layout is invalid, num_blocks is not in [1, 2^32 - 2], or the size
  //                      overflows;
  //   ResourceExhausted  the mapping failed (message names the bytes and strerror);
  //   the allocator's error, or InvalidArgument when its memory is too small or misaligned.
  static absl::StatusOr<std::unique_ptr<HostKvPool>> Create(const kvcache::KvLayout& layout,
                                                            int64_t num_blocks,
                                                            HostKvPoolOptions options = {});

  HostKvPool(const HostKvPool&) = delete;
  HostKvPool& operator=(const HostKvPool&) = delete;
  ~HostKvPool();

  // First byte of block `block`; `block` must be a valid id < num_blocks() (CHECKed).
  uint8_t* BlockData(BlockId block);
  const uint8_t* BlockData(BlockId block) const;

  // The whole pool: page-aligned, size_bytes() == num_blocks() * block_bytes().
  uint8_t* base() { return base_; }
  const uint8_t* base() const { return base_; }
  size_t size_bytes() const { return size_bytes_; }
  int64_t num_blocks() const { return num_blocks_; }
  size_t block_bytes() const { return block_bytes_; }
  const kvcache::KvLayout& layout() const { return layout_; }
  // Whether transparent huge pages were requested successfully (advisory; for logs).
  bool huge_pages() const { return huge_pages_; }

 private:
  HostKvPool(const kvcache::KvLayout& layout, int64_t num_blocks, uint8_t* base,
             size_t mapped_bytes, bool huge_pages, std::shared_ptr<void> external_owner);
  // Byte offset of `block` from base_ (CHECKs the id).
  size_t BlockOffset(BlockId block) const;

  const kvcache::KvLayout layout_;
  const int64_t num_blocks_;
  const size_t block_bytes_;
  const size_t size_bytes_;
  uint8_t* const base_;        // owned mapping of mapped_bytes_, or external memory
  const size_t mapped_bytes_;  // size_bytes_ rounded up to whole pages
  const bool huge_pages_;
  std::shared_ptr<void> external_owner_;  // set: base_ is external memory, not unmapped here
};

}  // namespace pd::memory
