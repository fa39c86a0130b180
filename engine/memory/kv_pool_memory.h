// KvPoolMemory: what the runtime and the worker need of the KV block pool's bytes, wherever
// they live. Two implementations: HostKvPoolMemory (a view of a HostKvPool, the CPU backend)
// and DeviceKvPool (device memory, engine/memory/device_kv_pool.h).
//
// Block b occupies [base() + b * block_bytes(), base() + (b + 1) * block_bytes()) in the
// device's address space, laid out as kvcache::KvLayout describes. base() is a host pointer
// only when device() is kCpu: host code must then go through ReadBlock / WriteBlock, which
// copy between the pool and host memory (the tier restore copy and the eviction hook).
//
// Thread-safety: implementations are thread-safe for distinct blocks; the scheduler hands a
// block to one writer at a time (the forward pass, a restore, or the transport).
#pragma once

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "common/base/strong_id.h"
#include "engine/kvcache/kv_layout.h"
#include "kernels/types.h"

namespace pd::memory {

class HostKvPool;

class KvPoolMemory {
 public:
  virtual ~KvPoolMemory() = default;

  // Where the bytes are (kCpu: host memory; kCuda: device memory of the current device).
  virtual kernels::Device device() const = 0;
  // The whole pool: size_bytes() == num_blocks() * block_bytes(), never moves.
  virtual void* base() = 0;
  virtual size_t size_bytes() const = 0;
  virtual int64_t num_blocks() const = 0;
  virtual size_t block_bytes() const = 0;
  virtual const kvcache::KvLayout& layout() const = 0;

  // Copies block `block` into host memory `dst` (block_bytes() bytes) and returns once the
  // bytes are there. InvalidArgument for an id outside the pool or a null dst; Internal (with
  // the CUDA error) when a device copy fails.
  virtual absl::Status ReadBlock(BlockId block, uint8_t* dst) = 0;
  // Copies block_bytes() bytes of host memory `src` into block `block` and returns once the
  // pool holds them (a later forward pass on any stream sees them). Errors as ReadBlock.
  virtual absl::Status WriteBlock(BlockId block, const uint8_t* src) = 0;
};

// KvPoolMemory over a HostKvPool (not owned; must outlive this view). Block copies are
// memcpy on the calling thread.
class HostKvPoolMemory final : public KvPoolMemory {
 public:
  explicit HostKvPoolMemory(HostKvPool* pool) : pool_(pool) {}

  kernels::Device device() const override { return kernels::Device::kCpu; }
  void* base() override;
  size_t size_bytes() const override;
  int64_t num_blocks() const override;
  size_t block_bytes() const override;
  const kvcache::KvLayout& layout() const override;
  absl::Status ReadBlock(BlockId block, uint8_t* dst) override;
  absl::Status WriteBlock(BlockId block, const uint8_t* src) override;

 private:
  HostKvPool* const pool_;
};

namespace internal {
// InvalidArgument unless `block` is a valid id < num_blocks and `ptr` is non-null.
absl::Status CheckBlockCopy(BlockId block, int64_t num_blocks, const void* ptr);
}  // namespace internal

}  // namespace pd::memory
