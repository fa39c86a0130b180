// DeviceKvPool: the KV block pool in device memory (tier G1 of docs/architecture.md, "Tiers", on
// a GPU), beside HostKvPool: one zero-initialised allocation of num_blocks * layout.block_bytes()
// on a kernels::Device, with block copies to and from host memory on a stream of its own.
//
// On kCuda the bytes are cudaMalloc'd on the current device; the transport may register
// [base(), base() + size_bytes()) as MemoryKind::kCuda. On kCpu it is plain host memory (tests,
// and a stand-in where a device is expected).
//
// Block copies (ReadBlock / WriteBlock) use cudaMemcpyAsync on the pool's stream and wait for
// it, so they are ordered after any earlier forward pass only if that pass synchronised: the
// runtime's forward pass synchronises at the end of every step, and copies run on the scheduler
// thread between steps.
//
// Ownership: RAII (the memory and the stream are released on destruction; outlive every
// registration and every forward pass over it). Thread-safety: thread-safe for distinct blocks.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "engine/kvcache/kv_layout.h"
#include "engine/memory/kv_pool_memory.h"
#include "kernels/device_memory.h"

namespace pd::memory {

class DeviceKvPool final : public KvPoolMemory {
 public:
  // InvalidArgument for an invalid layout, num_blocks outside [1, 2^32 - 2] or a size that
  // overflows; the errors of kernels/device_memory.h otherwise (Unimplemented naming
  // PD_ENABLE_CUDA, FailedPrecondition "no CUDA device", ResourceExhausted naming the bytes).
  static absl::StatusOr<std::unique_ptr<DeviceKvPool>> Create(const kvcache::KvLayout& layout,
                                                              int64_t num_blocks,
                                                              kernels::Device device);

  DeviceKvPool(const DeviceKvPool&) = delete;
  DeviceKvPool& operator=(const DeviceKvPool&) = delete;

  kernels::Device device() const override { return buffer_.device(); }
  void* base() override { return buffer_.data(); }
  size_t size_bytes() const override { return static_cast<size_t>(buffer_.size_bytes()); }
  int64_t num_blocks() const override { return num_blocks_; }
  size_t block_bytes() const override { return block_bytes_; }
  const kvcache::KvLayout& layout() const override { return layout_; }
  absl::Status ReadBlock(BlockId block, uint8_t* dst) override;
  absl::Status WriteBlock(BlockId block, const uint8_t* src) override;

 private:
  DeviceKvPool(const kvcache::KvLayout& layout, int64_t num_blocks, kernels::DeviceBuffer buffer,
               kernels::DeviceStream stream);

  const kvcache::KvLayout layout_;
  const int64_t num_blocks_;
  const size_t block_bytes_;
  kernels::DeviceBuffer buffer_;
  kernels::DeviceStream stream_;  // block copies
};

}  // namespace pd::memory
