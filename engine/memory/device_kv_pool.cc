#include "engine/memory/device_kv_pool.h"

#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/log/log.h"

namespace pd::memory {

absl::StatusOr<std::unique_ptr<DeviceKvPool>> DeviceKvPool::Create(const kvcache::KvLayout& layout,
                                                                   int64_t num_blocks,
                                                                   kernels::Device device) {
  PD_RETURN_IF_ERROR(layout.Validate());
  constexpr int64_t kMaxBlocks = int64_t{std::numeric_limits<uint32_t>::max()} - 1;
  if (num_blocks < 1 || num_blocks > kMaxBlocks) {
    return absl::InvalidArgumentError(absl::StrCat("device kv pool: num_blocks must be in [1, ",
                                                   kMaxBlocks, "], got ", num_blocks));
  }
  int64_t size_bytes = 0;
  if (__builtin_mul_overflow(layout.block_bytes(), num_blocks, &size_bytes)) {
    return absl::InvalidArgumentError(absl::StrCat("device kv pool: ", num_blocks, " blocks of ",
                                                   layout.block_bytes(),
                                                   " bytes overflow the size"));
  }
  PD_RETURN_IF_ERROR(kernels::CheckDeviceAvailable(device));
  PD_ASSIGN_OR_RETURN(kernels::DeviceStream stream, kernels::DeviceStream::Create(device));
  absl::StatusOr<kernels::DeviceBuffer> buffer =
      kernels::DeviceBuffer::Allocate(device, size_bytes);
  if (!buffer.ok()) {
    return absl::Status(buffer.status().code(),
                        absl::StrCat("device kv pool of ", num_blocks, " blocks (", size_bytes,
                                     " bytes): ", buffer.status().message()));
  }
  LOG(INFO) << "device kv pool: " << num_blocks << " blocks of " << layout.block_bytes()
            << " bytes (" << size_bytes << " bytes) on "
            << (device == kernels::Device::kCuda ? "cuda" : "cpu") << ", layout "
            << layout.ToString();
  return std::unique_ptr<DeviceKvPool>(
      new DeviceKvPool(layout, num_blocks, *std::move(buffer), std::move(stream)));
}

DeviceKvPool::DeviceKvPool(const kvcache::KvLayout& layout, int64_t num_blocks,
                           kernels::DeviceBuffer buffer, kernels::DeviceStream stream)
    : layout_(layout),
      num_blocks_(num_blocks),
      block_bytes_(static_cast<size_t>(layout.block_bytes())),
      buffer_(std::move(buffer)),
      stream_(std::move(stream)) {}

absl::Status DeviceKvPool::ReadBlock(BlockId block, uint8_t* dst) {
  PD_RETURN_IF_ERROR(internal::CheckBlockCopy(block, num_blocks_, dst));
  const uint8_t* src = buffer_.as<uint8_t>() + block.value() * block_bytes_;
  PD_RETURN_IF_ERROR(
      kernels::CopyAsync(stream_.context(), dst, src, static_cast<int64_t>(block_bytes_)));
  return stream_.Synchronize();
}

absl::Status DeviceKvPool::WriteBlock(BlockId block, const uint8_t* src) {
  PD_RETURN_IF_ERROR(internal::CheckBlockCopy(block, num_blocks_, src));
  uint8_t* dst = buffer_.as<uint8_t>() + block.value() * block_bytes_;
  PD_RETURN_IF_ERROR(
      kernels::CopyAsync(stream_.context(), dst, src, static_cast<int64_t>(block_bytes_)));
  return stream_.Synchronize();
}

}  // namespace pd::memory
