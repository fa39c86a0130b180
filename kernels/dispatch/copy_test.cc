#include "kernels/copy.h"

#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/dispatch/kernel_test_util.h"
#include "kernels/reference/reference_ops.h"

namespace pd::kernels {
namespace {

using testing::CpuVariants;
using testing::VariantScope;

std::vector<unsigned char> RandomBytes(int64_t n, std::mt19937& rng) {
  std::vector<unsigned char> v(n);
  for (unsigned char& b : v) {
    b = static_cast<unsigned char>(rng());
  }
  return v;
}

// The reference on a hand-made case: gather blocks 2 and 0 of a 3-block pool.
TEST(CopyBlocksReferenceTest, HandComputedGather) {
  const std::vector<unsigned char> pool = {1, 2, 9, 3, 4, 9, 5, 6, 9};  // 2 bytes, stride 3
  std::vector<unsigned char> out(4, 0);
  const std::vector<int32_t> ids = {2, 0};
  CopyBlocksParams p{pool.data(), out.data(), ids.data(), nullptr, 2, 2, 3, 2, 3, 2};
  reference::CopyBlocks(p);
  EXPECT_EQ(out, (std::vector<unsigned char>{5, 6, 1, 2}));
}

struct Case {
  const char* name;
  bool src_ids;
  bool dst_ids;
  int64_t block_bytes;
  int64_t num_copies;
};

TEST(CopyBlocksTest, MatchesReferenceOnEveryVariant) {
  const Case cases[] = {
      {"gather", true, false, 4096, 7},
      {"scatter", false, true, 4096, 7},
      {"move", true, true, 100, 9},
      {"one_byte_blocks", true, true, 1, 5},
      {"big_blocks", true, false, 3 << 20, 3},
      {"identity", false, false, 64, 4},
  };
  std::mt19937 rng(11);
  for (const Case& c : cases) {
    const int64_t src_blocks = 12, dst_blocks = 10;
    const int64_t src_stride = c.block_bytes + 8, dst_stride = c.block_bytes + 3;
    const std::vector<unsigned char> src = RandomBytes(src_blocks * src_stride, rng);
    std::vector<int32_t> src_ids(src_blocks), dst_ids(dst_blocks);
    std::iota(src_ids.begin(), src_ids.end(), 0);
    std::iota(dst_ids.begin(), dst_ids.end(), 0);
    std::shuffle(src_ids.begin(), src_ids.end(), rng);
    std::shuffle(dst_ids.begin(), dst_ids.end(), rng);
    CopyBlocksParams p;
    p.src = src.data();
    p.src_ids = c.src_ids ? src_ids.data() : nullptr;
    p.dst_ids = c.dst_ids ? dst_ids.data() : nullptr;
    p.num_copies = c.num_copies;
    p.block_bytes = c.block_bytes;
    p.src_block_stride_bytes = src_stride;
    p.dst_block_stride_bytes = dst_stride;
    p.src_num_blocks = src_blocks;
    p.dst_num_blocks = dst_blocks;
    const std::vector<unsigned char> dst0 = RandomBytes(dst_blocks * dst_stride, rng);
    std::vector<unsigned char> want = dst0;
    CopyBlocksParams rp = p;
    rp.dst = want.data();
    reference::CopyBlocks(rp);
    ASSERT_NE(want, dst0) << c.name;
    for (const auto& v : CpuVariants()) {
      VariantScope scope(v);
      std::vector<unsigned char> got = dst0;
      p.dst = got.data();
      ASSERT_TRUE(CopyBlocks(scope.ctx(), p).ok()) << c.name << " " << v.Name();
      EXPECT_EQ(got, want) << c.name << " " << v.Name();  // gaps between blocks untouched too
    }
  }
}

TEST(CopyBlocksTest, MoveWithinOnePool) {
  std::mt19937 rng(12);
  std::vector<unsigned char> pool = RandomBytes(8 * 32, rng), want = pool;
  const std::vector<int32_t> from = {1, 6}, to = {3, 0};
  CopyBlocksParams p{pool.data(), pool.data(), from.data(), to.data(), 2, 32, 32, 32, 8, 8};
  CopyBlocksParams rp = p;
  rp.src = rp.dst = want.data();
  reference::CopyBlocks(rp);
  ASSERT_TRUE(CopyBlocks(OpContext{}, p).ok());
  EXPECT_EQ(pool, want);
}

TEST(CopyBlocksTest, RejectsBadInput) {
  std::vector<unsigned char> a(1024), b(1024);
  const std::vector<int32_t> ids = {0, 1}, dup = {1, 1}, far = {0, 8};
  const CopyBlocksParams ok{a.data(), b.data(), ids.data(), ids.data(), 2, 64, 128, 128, 8, 8};
  ASSERT_TRUE(CopyBlocks(OpContext{}, ok).ok());
  CopyBlocksParams bad = ok;
  bad.num_copies = 0;
  bad.src = nullptr;
  EXPECT_TRUE(CopyBlocks(OpContext{}, bad).ok());  // nothing to do
  bad = ok;
  bad.src = nullptr;
  EXPECT_EQ(CopyBlocks(OpContext{}, bad).code(), absl::StatusCode::kInvalidArgument);
  bad = ok;
  bad.num_copies = -1;
  EXPECT_EQ(CopyBlocks(OpContext{}, bad).code(), absl::StatusCode::kInvalidArgument);
  bad = ok;
  bad.src_block_stride_bytes = 32;  // < block_bytes
  EXPECT_EQ(CopyBlocks(OpContext{}, bad).code(), absl::StatusCode::kInvalidArgument);
  bad = ok;
  bad.dst_ids = dup.data();
  EXPECT_EQ(CopyBlocks(OpContext{}, bad).code(), absl::StatusCode::kInvalidArgument);
  bad = ok;
  bad.src_ids = far.data();
  EXPECT_EQ(CopyBlocks(OpContext{}, bad).code(), absl::StatusCode::kInvalidArgument);
  bad = ok;
  bad.src_ids = nullptr;
  bad.num_copies = 2;
  bad.src_num_blocks = 1;  // identity ids 0, 1 but one block
  EXPECT_EQ(CopyBlocks(OpContext{}, bad).code(), absl::StatusCode::kInvalidArgument);
  bad = ok;
  bad.dst = a.data() + 64;  // pools partly overlap
  EXPECT_EQ(CopyBlocks(OpContext{}, bad).code(), absl::StatusCode::kInvalidArgument);
  bad = ok;
  bad.dst = a.data();  // same pool: block 0 and 1 both read and written
  EXPECT_EQ(CopyBlocks(OpContext{}, bad).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(SupportsCopyBlocks(Device::kCpu));
}

}  // namespace
}  // namespace pd::kernels
