#include "engine/memory/host_kv_pool.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/log/log.h"

namespace pd::memory {
namespace {

constexpr size_t kHugePageBytes = size_t{2} << 20;

}  // namespace

absl::StatusOr<std::unique_ptr<HostKvPool>> HostKvPool::Create(const kvcache::KvLayout& layout,
                                                               int64_t num_blocks,
                                                               HostKvPoolOptions options) {
  PD_RETURN_IF_ERROR(layout.Validate());
  // Block ids are uint32 with the max value reserved as "invalid".
  constexpr int64_t kMaxBlocks = int64_t{std::numeric_limits<uint32_t>::max()} - 1;
  if (num_blocks < 1 || num_blocks > kMaxBlocks) {
    return absl::InvalidArgumentError(absl::StrCat("host kv pool: num_blocks must be in [1, ",
                                                   kMaxBlocks, "], got ", num_blocks));
  }
  const size_t block_bytes = static_cast<size_t>(layout.block_bytes());
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  size_t size_bytes = 0;
  if (__builtin_mul_overflow(block_bytes, static_cast<size_t>(num_blocks), &size_bytes) ||
      size_bytes > std::numeric_limits<size_t>::max() - page) {
    return absl::InvalidArgumentError(absl::StrCat("host kv pool: ", num_blocks, " blocks of ",
                                                   block_bytes, " bytes overflow the size"));
  }
  const size_t mapped_bytes = (size_bytes + page - 1) / page * page;
  if (options.allocator) {
    PD_ASSIGN_OR_RETURN(ExternalPoolMemory ext, options.allocator(size_bytes));
    if (ext.base == nullptr || ext.owner == nullptr || ext.size < size_bytes ||
        reinterpret_cast<uintptr_t>(ext.base) % 64 != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "host kv pool: external memory at ", reinterpret_cast<uintptr_t>(ext.base), " of ",
          ext.size, " bytes is unusable for ", size_bytes,
          " bytes (needs an owner, that size and 64-byte alignment)"));
    }
    LOG(INFO) << "host kv pool: " << num_blocks << " blocks of " << block_bytes << " bytes ("
              << size_bytes << " bytes in " << ext.description << "), layout "
              << layout.ToString();
    return std::unique_ptr<HostKvPool>(new HostKvPool(layout, num_blocks, ext.base, ext.size,
                                                      false, std::move(ext.owner)));
  }
  const int flags = MAP_PRIVATE | MAP_ANONYMOUS | (options.populate ? MAP_POPULATE : 0);
  void* base = mmap(nullptr, mapped_bytes, PROT_READ | PROT_WRITE, flags, -1, 0);
  if (base == MAP_FAILED) {
    const int err = errno;
    return absl::ResourceExhaustedError(absl::StrCat("host kv pool: cannot map ", size_bytes,
                                                     " bytes (", num_blocks, " blocks of ",
                                                     block_bytes, "): ", std::strerror(err)));
  }
  bool huge_pages = false;
  if (options.huge_pages && mapped_bytes >= kHugePageBytes) {
    // Best effort: EINVAL where THP is compiled out or disabled; the pool works either way.
    huge_pages = madvise(base, mapped_bytes, MADV_HUGEPAGE) == 0;
    if (!huge_pages) {
      VLOG(1) << "host kv pool: madvise(MADV_HUGEPAGE) failed: " << std::strerror(errno);
    }
  }
  LOG(INFO) << "host kv pool: " << num_blocks << " blocks of " << block_bytes << " bytes ("
            << size_bytes << " bytes, huge_pages=" << huge_pages
            << ", populate=" << options.populate << "), layout " << layout.ToString();
  return std::unique_ptr<HostKvPool>(
      new HostKvPool(layout, num_blocks, static_cast<uint8_t*>(base), mapped_bytes, huge_pages,
                     nullptr));
}

HostKvPool::HostKvPool(const kvcache::KvLayout& layout, int64_t num_blocks, uint8_t* base,
                       size_t mapped_bytes, bool huge_pages,
                       std::shared_ptr<void> external_owner)
    : layout_(layout),
      num_blocks_(num_blocks),
      block_bytes_(static_cast<size_t>(layout.block_bytes())),
      size_bytes_(block_bytes_ * static_cast<size_t>(num_blocks)),
      base_(base),
      mapped_bytes_(mapped_bytes),
      huge_pages_(huge_pages),
      external_owner_(std::move(external_owner)) {}

HostKvPool::~HostKvPool() {
  if (external_owner_ != nullptr) {
    return;  // the owner frees it (when its last reference goes)
  }
  if (munmap(base_, mapped_bytes_) != 0) {
    LOG(ERROR) << "host kv pool: munmap of " << mapped_bytes_
               << " bytes failed: " << std::strerror(errno);
  }
}

size_t HostKvPool::BlockOffset(BlockId block) const {
  CHECK(block.valid() && block.value() < static_cast<uint64_t>(num_blocks_))
      << "block " << block << " of " << num_blocks_;
  return static_cast<size_t>(block.value()) * block_bytes_;
}

uint8_t* HostKvPool::BlockData(BlockId block) { return base_ + BlockOffset(block); }

const uint8_t* HostKvPool::BlockData(BlockId block) const { return base_ + BlockOffset(block); }

}  // namespace pd::memory
