// KvPoolMemory implementations: HostKvPoolMemory over a HostKvPool, DeviceKvPool on kCpu (the
// same code as kCuda minus the CUDA calls), and DeviceKvPool on kCuda where this machine has no
// backend or no device. Label unit.
#include "engine/memory/kv_pool_memory.h"

#include <cstdint>
#include <memory>
#include <numeric>
#include <vector>

#include "engine/memory/device_kv_pool.h"
#include "engine/memory/host_kv_pool.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/device_memory.h"

namespace pd::memory {
namespace {

using ::testing::HasSubstr;

kvcache::KvLayout Small() {
  return kvcache::KvLayout{.num_layers = 2,
                           .num_kv_heads = 2,
                           .head_dim = 8,
                           .block_size = 4,
                           .dtype = kernels::DType::kF32};  // 1024-byte blocks
}

// The contract every implementation meets: zeroed blocks, write/read round trips per block,
// block b at base + b * block_bytes, ids and null buffers refused.
void CheckPoolContract(KvPoolMemory* pool, int64_t num_blocks) {
  ASSERT_EQ(pool->num_blocks(), num_blocks);
  ASSERT_EQ(pool->block_bytes(), 1024u);
  ASSERT_EQ(pool->size_bytes(), 1024u * num_blocks);
  EXPECT_EQ(pool->layout(), Small());
  std::vector<uint8_t> zeros(1024, 0), got(1024, 0xFF);
  ASSERT_TRUE(pool->ReadBlock(BlockId(num_blocks - 1), got.data()).ok());
  EXPECT_EQ(got, zeros);
  for (uint32_t b = 0; b < num_blocks; ++b) {
    std::vector<uint8_t> bytes(1024);
    std::iota(bytes.begin(), bytes.end(), static_cast<uint8_t>(b * 7));
    ASSERT_TRUE(pool->WriteBlock(BlockId(b), bytes.data()).ok());
  }
  for (uint32_t b = 0; b < num_blocks; ++b) {
    std::vector<uint8_t> want(1024);
    std::iota(want.begin(), want.end(), static_cast<uint8_t>(b * 7));
    ASSERT_TRUE(pool->ReadBlock(BlockId(b), got.data()).ok());
    EXPECT_EQ(got, want) << "block " << b;
  }
  if (pool->device() == kernels::Device::kCpu) {  // base() is host memory: check placement
    const uint8_t* base = static_cast<const uint8_t*>(pool->base());
    EXPECT_EQ(base[3 * 1024 + 5], static_cast<uint8_t>(3 * 7 + 5));
  }
  EXPECT_EQ(pool->ReadBlock(BlockId(static_cast<uint32_t>(num_blocks)), got.data()).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(pool->WriteBlock(BlockId::Invalid(), got.data()).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(pool->ReadBlock(BlockId(0), nullptr).code(), absl::StatusCode::kInvalidArgument);
}

TEST(KvPoolMemoryTest, HostViewMeetsTheContract) {
  auto host = HostKvPool::Create(Small(), 6);
  ASSERT_TRUE(host.ok()) << host.status();
  HostKvPoolMemory view(host->get());
  EXPECT_EQ(view.device(), kernels::Device::kCpu);
  EXPECT_EQ(view.base(), (*host)->base());
  CheckPoolContract(&view, 6);
  EXPECT_EQ((*host)->BlockData(BlockId(2))[1], static_cast<uint8_t>(2 * 7 + 1));
}

TEST(KvPoolMemoryTest, DeviceKvPoolOnCpuMeetsTheContract) {
  auto pool = DeviceKvPool::Create(Small(), 5, kernels::Device::kCpu);
  ASSERT_TRUE(pool.ok()) << pool.status();
  EXPECT_EQ((*pool)->device(), kernels::Device::kCpu);
  CheckPoolContract(pool->get(), 5);
}

TEST(KvPoolMemoryTest, DeviceKvPoolRejectsBadGeometry) {
  EXPECT_EQ(DeviceKvPool::Create(Small(), 0, kernels::Device::kCpu).status().code(),
            absl::StatusCode::kInvalidArgument);
  kvcache::KvLayout bad = Small();
  bad.head_dim = 0;
  EXPECT_EQ(DeviceKvPool::Create(bad, 4, kernels::Device::kCpu).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(KvPoolMemoryTest, DeviceKvPoolOnCudaWhereverThisRuns) {
  auto pool = DeviceKvPool::Create(Small(), 4, kernels::Device::kCuda);
  if (!kernels::DeviceMemoryBuilt(kernels::Device::kCuda)) {
    EXPECT_EQ(pool.status().code(), absl::StatusCode::kUnimplemented);
    EXPECT_THAT(pool.status().message(), HasSubstr("PD_ENABLE_CUDA"));
  } else if (kernels::DeviceCount(kernels::Device::kCuda) == 0) {
    EXPECT_EQ(pool.status().code(), absl::StatusCode::kFailedPrecondition) << pool.status();
    EXPECT_THAT(pool.status().message(), HasSubstr("no CUDA device"));
  } else {
    ASSERT_TRUE(pool.ok()) << pool.status();
    EXPECT_EQ((*pool)->device(), kernels::Device::kCuda);
    CheckPoolContract(pool->get(), 4);
  }
}

}  // namespace
}  // namespace pd::memory
