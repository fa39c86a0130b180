#include "engine/kvcache/kv_layout.h"

#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pd::kvcache {
namespace {

using ::testing::HasSubstr;

KvLayout Tiny() {
  return KvLayout{.num_layers = 2,
                  .num_kv_heads = 3,
                  .head_dim = 4,
                  .block_size = 5,
                  .dtype = kernels::DType::kF32};
}

TEST(KvLayoutTest, StridesFollowDesignLayout) {
  const KvLayout l = Tiny();
  ASSERT_TRUE(l.Validate().ok());
  EXPECT_EQ(l.token_stride(), 4);
  EXPECT_EQ(l.head_stride(), 5 * 4);
  EXPECT_EQ(l.kv_stride(), 3 * 5 * 4);
  EXPECT_EQ(l.layer_stride(), 2 * 3 * 5 * 4);
  EXPECT_EQ(l.block_elements(), 2 * 2 * 3 * 5 * 4);
  EXPECT_EQ(l.block_bytes(), 2 * 2 * 3 * 5 * 4 * 4);
  EXPECT_EQ(l.ElementOffset(1, KvPart::kValue, 2, 3), 1 * 120 + 1 * 60 + 2 * 20 + 3 * 4);
  EXPECT_EQ(l.ByteOffset(1, KvPart::kValue, 2, 3), (120 + 60 + 40 + 12) * 4);
}

TEST(KvLayoutTest, OffsetsTileTheBlockExactly) {
  const KvLayout l = Tiny();
  std::vector<int> hits(l.block_elements(), 0);
  for (int64_t layer = 0; layer < l.num_layers; ++layer) {
    for (KvPart part : {KvPart::kKey, KvPart::kValue}) {
      for (int64_t head = 0; head < l.num_kv_heads; ++head) {
        for (int64_t token = 0; token < l.block_size; ++token) {
          for (int64_t d = 0; d < l.head_dim; ++d) {
            ++hits[l.ElementOffset(layer, part, head, token) + d];
          }
        }
      }
    }
  }
  for (int h : hits) {
    ASSERT_EQ(h, 1);
  }
}

TEST(KvLayoutTest, Llama3_8bBf16BlockIsTwoMiB) {
  const KvLayout l{.num_layers = 32,
                   .num_kv_heads = 8,
                   .head_dim = 128,
                   .block_size = 16,
                   .dtype = kernels::DType::kBF16};
  ASSERT_TRUE(l.Validate().ok());
  EXPECT_EQ(l.block_bytes(), 2 * 1024 * 1024);
}

TEST(KvLayoutTest, ValidateNamesTheBadField) {
  KvLayout l = Tiny();
  l.head_dim = 0;
  EXPECT_THAT(l.Validate().message(), HasSubstr("head_dim"));
  l = Tiny();
  l.num_layers = -1;
  EXPECT_TRUE(absl::IsInvalidArgument(l.Validate()));
  l = Tiny();
  l.dtype = static_cast<kernels::DType>(9);
  EXPECT_THAT(l.Validate().message(), HasSubstr("dtype"));
  for (kernels::DType q : {kernels::DType::kI8, kernels::DType::kF8E4M3}) {
    l = Tiny();
    l.dtype = q;  // quantized: 1-byte data padded to 16 bytes, then an f32 scale per row
    EXPECT_TRUE(l.Validate().ok()) << l.Validate();
    const int64_t rows = l.num_layers * 2 * l.num_kv_heads * l.block_size;
    EXPECT_EQ(l.block_bytes(), (rows * l.head_dim + 15) / 16 * 16 + 4 * rows);
  }
  l = Tiny();
  l.dtype = kernels::DType::kI4;  // two codes a byte: head_dim 4 -> 2-byte rows, a scale each
  EXPECT_TRUE(l.Validate().ok()) << l.Validate();
  const int64_t rows = l.num_layers * 2 * l.num_kv_heads * l.block_size;
  EXPECT_EQ(l.block_bytes(), (rows * 2 + 15) / 16 * 16 + 4 * rows);
  EXPECT_EQ(l.token_stride(), 2);
  l.head_dim = 5;
  EXPECT_THAT(l.Validate().message(), HasSubstr("even head_dim"));
  l = Tiny();
  l.num_layers = int64_t{1} << 40;  // would overflow any int64 product without the guard
  l.head_dim = int64_t{1} << 40;
  EXPECT_THAT(l.Validate().message(), HasSubstr("exceeds"));
}

TEST(KvLayoutTest, ToStringAndNames) {
  KvLayout l = Tiny();
  l.dtype = kernels::DType::kBF16;
  EXPECT_EQ(l.ToString(), "layers=2 kv_heads=3 head_dim=4 block_size=5 dtype=bf16 block_bytes=480");
  EXPECT_EQ(DTypeName(kernels::DType::kF32), "f32");
  EXPECT_EQ(DTypeName(kernels::DType::kF16), "f16");
  EXPECT_EQ(l, l);
  KvLayout other = l;
  other.block_size = 16;
  EXPECT_NE(l, other);
}

}  // namespace
}  // namespace pd::kvcache
