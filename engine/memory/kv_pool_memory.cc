#include "engine/memory/kv_pool_memory.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "engine/memory/host_kv_pool.h"

namespace pd::memory {

namespace internal {

absl::Status CheckBlockCopy(BlockId block, int64_t num_blocks, const void* ptr) {
  if (!block.valid() || block.value() >= static_cast<uint64_t>(num_blocks)) {
    return absl::InvalidArgumentError(
        absl::StrCat("kv pool: block ", block.value(), " outside the pool of ", num_blocks));
  }
  if (ptr == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("kv pool: null host buffer for block ", block.value()));
  }
  return absl::OkStatus();
}

}  // namespace internal

void* HostKvPoolMemory::base() { return pool_->base(); }
size_t HostKvPoolMemory::size_bytes() const { return pool_->size_bytes(); }
int64_t HostKvPoolMemory::num_blocks() const { return pool_->num_blocks(); }
size_t HostKvPoolMemory::block_bytes() const { return pool_->block_bytes(); }
const kvcache::KvLayout& HostKvPoolMemory::layout() const { return pool_->layout(); }

absl::Status HostKvPoolMemory::ReadBlock(BlockId block, uint8_t* dst) {
  PD_RETURN_IF_ERROR(internal::CheckBlockCopy(block, pool_->num_blocks(), dst));
  std::memcpy(dst, pool_->BlockData(block), pool_->block_bytes());
  return absl::OkStatus();
}

absl::Status HostKvPoolMemory::WriteBlock(BlockId block, const uint8_t* src) {
  PD_RETURN_IF_ERROR(internal::CheckBlockCopy(block, pool_->num_blocks(), src));
  std::memcpy(pool_->BlockData(block), src, pool_->block_bytes());
  return absl::OkStatus();
}

}  // namespace pd::memory
