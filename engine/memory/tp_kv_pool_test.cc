// TpKvPool: blocks scattered to the ranks' pools by head and gathered back into the TP = 1
// layout, for float and quantized dtypes, split and replicated heads; what it refuses. Label
// unit.
#include "engine/memory/tp_kv_pool.h"

#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/memory/device_kv_pool.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/attention_params.h"
#include "kernels/type_names.h"

namespace pd::memory {
namespace {

using ::testing::HasSubstr;
using Heads = std::vector<TpKvPool::RankHeads>;

kvcache::KvLayout Layout(kernels::DType dtype) {
  return kvcache::KvLayout{
      .num_layers = 3, .num_kv_heads = 4, .head_dim = 8, .block_size = 4, .dtype = dtype};
}

// A random block of `layout`, its padding (between a quantized block's data and scales) zero.
std::vector<uint8_t> RandomBlock(const kvcache::KvLayout& layout, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> b(static_cast<size_t>(layout.block_bytes()));
  for (uint8_t& x : b) x = static_cast<uint8_t>(rng());
  if (kernels::IsQuantizedKvDType(layout.dtype)) {
    const int64_t data = layout.num_layers * 2 * layout.num_kv_heads * layout.head_stride();
    const int64_t scales = kernels::DenseKvScaleOffset(
        layout.dtype, layout.num_layers, layout.num_kv_heads, layout.block_size, layout.head_dim);
    std::memset(b.data() + data, 0, static_cast<size_t>(scales - data));
  }
  return b;
}

// Every head a rank holds is, in its pool, the TP = 1 block's rows and scales of that head.
void ExpectRankHoldsItsHeads(TpKvPool& pool, int r, BlockId block,
                             const std::vector<uint8_t>& whole) {
  const kvcache::KvLayout& full = pool.layout();
  KvPoolMemory& rank = *pool.rank(r);
  const kvcache::KvLayout& mine = rank.layout();
  std::vector<uint8_t> got(rank.block_bytes());
  ASSERT_TRUE(rank.ReadBlock(block, got.data()).ok());
  const TpKvPool::RankHeads heads = pool.rank_heads(r);
  const int64_t rows = full.head_stride() * full.element_size_bytes();
  for (int64_t l = 0; l < full.num_layers; ++l) {
    for (const kvcache::KvPart p : {kvcache::KvPart::kKey, kvcache::KvPart::kValue}) {
      for (int64_t h = 0; h < heads.count; ++h) {
        EXPECT_EQ(std::memcmp(got.data() + mine.ByteOffset(l, p, h, 0),
                              whole.data() + full.ByteOffset(l, p, heads.begin + h, 0),
                              static_cast<size_t>(rows)),
                  0)
            << "rank " << r << " layer " << l << " head " << heads.begin + h;
      }
    }
  }
}

TEST(TpKvPoolTest, BlocksScatterToTheRanksAndGatherBackInTheTp1Layout) {
  for (const kernels::DType dtype :
       {kernels::DType::kF32, kernels::DType::kBF16, kernels::DType::kI8, kernels::DType::kI4}) {
    // Split (2 ranks of 2 heads), replicated (8 ranks, two per head, as a TP 8 worker of a
    // model with 4 KV heads holds them) and whole (one rank).
    for (const Heads& heads :
         {Heads{{0, 2}, {2, 2}},
          Heads{{0, 1}, {0, 1}, {1, 1}, {1, 1}, {2, 1}, {2, 1}, {3, 1}, {3, 1}}, Heads{{0, 4}}}) {
      SCOPED_TRACE(absl::StrCat(kernels::DTypeName(dtype), ", ", heads.size(), " ranks"));
      const kvcache::KvLayout layout = Layout(dtype);
      absl::StatusOr<std::unique_ptr<TpKvPool>> pool = TpKvPool::CreateHost(layout, 5, heads);
      ASSERT_TRUE(pool.ok()) << pool.status();
      TpKvPool& p = **pool;
      EXPECT_EQ(p.block_bytes(), static_cast<size_t>(layout.block_bytes()));
      EXPECT_EQ(p.base(), nullptr);
      std::vector<uint8_t> got(p.block_bytes(), 0xAB), zero(p.block_bytes(), 0);
      ASSERT_TRUE(p.ReadBlock(BlockId(4), got.data()).ok());
      EXPECT_EQ(got, zero);  // a new pool reads as zeros
      std::vector<std::vector<uint8_t>> blocks;
      for (uint32_t b = 0; b < 5; ++b) {
        blocks.push_back(RandomBlock(layout, b + 1));
        ASSERT_TRUE(p.WriteBlock(BlockId(b), blocks.back().data()).ok());
      }
      for (uint32_t b = 0; b < 5; ++b) {
        ASSERT_TRUE(p.ReadBlock(BlockId(b), got.data()).ok());
        EXPECT_EQ(got, blocks[b]) << "block " << b;
        for (int r = 0; r < p.num_ranks(); ++r) {
          ExpectRankHoldsItsHeads(p, r, BlockId(b), blocks[b]);
        }
      }
      EXPECT_EQ(p.ReadBlock(BlockId(5), got.data()).code(), absl::StatusCode::kInvalidArgument);
      EXPECT_EQ(p.WriteBlock(BlockId(0), nullptr).code(), absl::StatusCode::kInvalidArgument);
    }
  }
}

// A replicated head is read from its first holder: a copy another rank changed on its own
// (which the forward pass never does) is not what the tiers get.
TEST(TpKvPoolTest, AReplicatedHeadIsReadFromItsFirstHolder) {
  const kvcache::KvLayout layout = Layout(kernels::DType::kF32);
  absl::StatusOr<std::unique_ptr<TpKvPool>> pool =
      TpKvPool::CreateHost(layout, 2, {{0, 4}, {0, 4}});
  ASSERT_TRUE(pool.ok()) << pool.status();
  const std::vector<uint8_t> block = RandomBlock(layout, 7);
  ASSERT_TRUE((*pool)->WriteBlock(BlockId(1), block.data()).ok());
  std::vector<uint8_t> other(block.size(), 0x5A);
  ASSERT_TRUE((*pool)->rank(1)->WriteBlock(BlockId(1), other.data()).ok());
  std::vector<uint8_t> got(block.size());
  ASSERT_TRUE((*pool)->ReadBlock(BlockId(1), got.data()).ok());
  EXPECT_EQ(got, block);
}

// Pools made elsewhere (here DeviceKvPool on the host, as a GPU worker would make one per
// device) are used as they are, and ones that do not fit are named.
TEST(TpKvPoolTest, TakesRankPoolsMadeElsewhereAndNamesOnesThatDoNotFit) {
  const kvcache::KvLayout layout = Layout(kernels::DType::kBF16);
  const Heads heads = {{0, 2}, {2, 2}};
  std::vector<std::unique_ptr<KvPoolMemory>> pools;
  for (const auto& h : heads) {
    absl::StatusOr<std::unique_ptr<DeviceKvPool>> d =
        DeviceKvPool::Create(TpKvPool::RankLayout(layout, h), 3, kernels::Device::kCpu);
    ASSERT_TRUE(d.ok()) << d.status();
    pools.push_back(*std::move(d));
  }
  absl::StatusOr<std::unique_ptr<TpKvPool>> pool =
      TpKvPool::FromRanks(layout, 3, heads, std::move(pools));
  ASSERT_TRUE(pool.ok()) << pool.status();
  const std::vector<uint8_t> block = RandomBlock(layout, 3);
  ASSERT_TRUE((*pool)->WriteBlock(BlockId(2), block.data()).ok());
  std::vector<uint8_t> got(block.size());
  ASSERT_TRUE((*pool)->ReadBlock(BlockId(2), got.data()).ok());
  EXPECT_EQ(got, block);

  std::vector<std::unique_ptr<KvPoolMemory>> wrong;
  for (int r = 0; r < 2; ++r) {  // rank 1's pool has 3 heads, not 2
    absl::StatusOr<std::unique_ptr<DeviceKvPool>> d =
        DeviceKvPool::Create(TpKvPool::RankLayout(layout, {0, 2 + r}), 3, kernels::Device::kCpu);
    ASSERT_TRUE(d.ok()) << d.status();
    wrong.push_back(*std::move(d));
  }
  const absl::Status bad = TpKvPool::FromRanks(layout, 3, heads, std::move(wrong)).status();
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.message(), HasSubstr("rank 1's pool"));
}

TEST(TpKvPoolTest, RefusesHeadsOutsideTheLayoutAndHeadsNoRankHolds) {
  const kvcache::KvLayout layout = Layout(kernels::DType::kF32);
  absl::Status s = TpKvPool::CreateHost(layout, 2, {{0, 2}, {2, 3}}).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("rank 1 holds heads [2, 5)"));
  s = TpKvPool::CreateHost(layout, 2, {{0, 2}, {3, 1}}).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("KV head 2 is held by no rank"));
  s = TpKvPool::CreateHost(layout, 2, {}).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace pd::memory
