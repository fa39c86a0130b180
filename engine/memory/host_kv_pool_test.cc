#include "engine/memory/host_kv_pool.h"

#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pd::memory {
namespace {

using ::testing::HasSubstr;

kvcache::KvLayout Small() {
  return kvcache::KvLayout{.num_layers = 2,
                           .num_kv_heads = 2,
                           .head_dim = 8,
                           .block_size = 4,
                           .dtype = kernels::DType::kBF16};  // 512-byte blocks
}

TEST(HostKvPoolTest, BlocksTileOnePageAlignedRegion) {
  auto pool = HostKvPool::Create(Small(), 10);
  ASSERT_TRUE(pool.ok()) << pool.status();
  HostKvPool& p = **pool;
  EXPECT_EQ(p.block_bytes(), 512u);
  EXPECT_EQ(p.size_bytes(), 5120u);
  EXPECT_EQ(p.num_blocks(), 10);
  EXPECT_EQ(p.layout(), Small());
  EXPECT_EQ(reinterpret_cast<uintptr_t>(p.base()) % sysconf(_SC_PAGESIZE), 0u);
  for (uint32_t b = 0; b < 10; ++b) {
    EXPECT_EQ(p.BlockData(BlockId(b)), p.base() + b * 512);
  }
  const HostKvPool& cp = p;
  EXPECT_EQ(cp.BlockData(BlockId(3)), cp.base() + 3 * 512);
}

TEST(HostKvPoolTest, MemoryIsZeroedAndBlocksDoNotOverlap) {
  auto pool = HostKvPool::Create(Small(), 7, {.populate = true});
  ASSERT_TRUE(pool.ok()) << pool.status();
  HostKvPool& p = **pool;
  for (size_t i = 0; i < p.size_bytes(); ++i) {
    ASSERT_EQ(p.base()[i], 0) << i;
  }
  for (uint32_t b = 0; b < 7; ++b) {
    std::memset(p.BlockData(BlockId(b)), static_cast<int>(b + 1), p.block_bytes());
  }
  for (uint32_t b = 0; b < 7; ++b) {
    const uint8_t* d = p.BlockData(BlockId(b));
    for (size_t i = 0; i < p.block_bytes(); ++i) {
      ASSERT_EQ(d[i], b + 1) << "block " << b << " byte " << i;
    }
  }
}

TEST(HostKvPoolTest, LayoutOffsetsAddressTheBlock) {
  auto pool = HostKvPool::Create(Small(), 2);
  ASSERT_TRUE(pool.ok()) << pool.status();
  HostKvPool& p = **pool;
  const kvcache::KvLayout& l = p.layout();
  // The last element of the last block is the last byte pair of the pool.
  uint8_t* last = p.BlockData(BlockId(1)) +
                  l.ByteOffset(l.num_layers - 1, kvcache::KvPart::kValue, l.num_kv_heads - 1,
                               l.block_size - 1) +
                  (l.head_dim - 1) * l.element_size_bytes();
  EXPECT_EQ(last + l.element_size_bytes(), p.base() + p.size_bytes());
}

TEST(HostKvPoolTest, HugePagesAreBestEffort) {
  // 2 MiB blocks: madvise may or may not be allowed here; creation succeeds either way.
  const kvcache::KvLayout l{.num_layers = 32,
                            .num_kv_heads = 8,
                            .head_dim = 128,
                            .block_size = 16,
                            .dtype = kernels::DType::kBF16};
  auto pool = HostKvPool::Create(l, 2, {.huge_pages = true});
  ASSERT_TRUE(pool.ok()) << pool.status();
  EXPECT_EQ((*pool)->size_bytes(), size_t{4} << 20);
  (*pool)->BlockData(BlockId(1))[0] = 1;
  auto plain = HostKvPool::Create(l, 2, {.huge_pages = false});
  ASSERT_TRUE(plain.ok());
  EXPECT_FALSE((*plain)->huge_pages());
}

TEST(HostKvPoolTest, RejectsBadArguments) {
  kvcache::KvLayout bad = Small();
  bad.head_dim = 0;
  EXPECT_TRUE(absl::IsInvalidArgument(HostKvPool::Create(bad, 4).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(HostKvPool::Create(Small(), 0).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(HostKvPool::Create(Small(), int64_t{1} << 33).status()));
}

TEST(HostKvPoolTest, MappingFailureIsResourceExhaustedNamingTheBytes) {
  // 2^30 blocks of 1 MiB = 2^50 bytes: beyond the 47-bit user address space, whatever the
  // overcommit policy.
  const kvcache::KvLayout l{.num_layers = 4,
                            .num_kv_heads = 4,
                            .head_dim = 128,
                            .block_size = 64,
                            .dtype = kernels::DType::kF32};
  ASSERT_EQ(l.block_bytes(), int64_t{1} << 20);
  auto pool = HostKvPool::Create(l, int64_t{1} << 30);
  EXPECT_TRUE(absl::IsResourceExhausted(pool.status())) << pool.status();
  EXPECT_THAT(pool.status().message(), HasSubstr("1125899906842624 bytes"));
}

TEST(HostKvPoolTest, AdoptsExternalMemoryAndLeavesItToItsOwner) {
  auto buffer = std::make_shared<std::vector<uint64_t>>(5120 / 8 + 8, 0);
  std::weak_ptr<std::vector<uint64_t>> alive = buffer;
  // 64-byte aligned start inside the buffer (8 spare words).
  const uintptr_t raw = reinterpret_cast<uintptr_t>(buffer->data());
  uint8_t* const base = reinterpret_cast<uint8_t*>((raw + 63) / 64 * 64);
  const size_t word = static_cast<size_t>(base - reinterpret_cast<uint8_t*>(raw)) / 8;
  size_t asked = 0;
  HostKvPoolOptions options;
  options.allocator = [&](size_t bytes) -> absl::StatusOr<ExternalPoolMemory> {
    asked = bytes;
    return ExternalPoolMemory{base, 5120, buffer, "test vector"};
  };
  {
    auto pool = HostKvPool::Create(Small(), 10, options);
    ASSERT_TRUE(pool.ok()) << pool.status();
    EXPECT_EQ(asked, 5120u);
    EXPECT_EQ((*pool)->base(), base);
    EXPECT_EQ((*pool)->BlockData(BlockId(9)), (*pool)->base() + 9 * 512);
    std::memset((*pool)->BlockData(BlockId(9)), 0xab, 512);
    buffer.reset();  // the pool keeps it alive
    EXPECT_FALSE(alive.expired());
    EXPECT_EQ(alive.lock()->at(word + 9 * 512 / 8), 0xababababababababULL);
  }
  EXPECT_TRUE(alive.expired());  // released with the pool, not unmapped by it
}

TEST(HostKvPoolTest, UnusableExternalMemoryIsNamed) {
  auto small = std::make_shared<std::vector<uint64_t>>(16, 0);
  HostKvPoolOptions options;
  options.allocator = [&](size_t) -> absl::StatusOr<ExternalPoolMemory> {
    return ExternalPoolMemory{reinterpret_cast<uint8_t*>(small->data()), 128, small, "tiny"};
  };
  auto pool = HostKvPool::Create(Small(), 10, options);
  EXPECT_TRUE(absl::IsInvalidArgument(pool.status())) << pool.status();
  EXPECT_THAT(pool.status().message(), HasSubstr("128 bytes is unusable for 5120 bytes"));
  options.allocator = [](size_t) -> absl::StatusOr<ExternalPoolMemory> {
    return absl::ResourceExhaustedError("no segment left");
  };
  pool = HostKvPool::Create(Small(), 10, options);
  EXPECT_TRUE(absl::IsResourceExhausted(pool.status())) << pool.status();
}

TEST(HostKvPoolDeathTest, OutOfRangeBlockIsAProgrammingError) {
  auto pool = HostKvPool::Create(Small(), 2);
  ASSERT_TRUE(pool.ok());
  EXPECT_DEATH((*pool)->BlockData(BlockId(2)), "block 2 of 2");
  EXPECT_DEATH((*pool)->BlockData(BlockId::Invalid()), "of 2");
}

}  // namespace
}  // namespace pd::memory
