#include "kernels/type_names.h"

#include "gtest/gtest.h"
#include "kernels/attention_params.h"
#include "kernels/types.h"

namespace pd::kernels {
namespace {

TEST(DTypeNameTest, NamesRoundTrip) {
  for (DType dtype :
       {DType::kF32, DType::kBF16, DType::kF16, DType::kI8, DType::kF8E4M3, DType::kI4}) {
    const absl::StatusOr<DType> parsed = DTypeFromName(DTypeName(dtype));
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_EQ(*parsed, dtype);
  }
  EXPECT_EQ(DTypeName(DType::kI8), "i8");
  EXPECT_EQ(DTypeName(DType::kF8E4M3), "fp8_e4m3");
  EXPECT_EQ(DTypeName(DType::kI4), "i4");
  EXPECT_EQ(DTypeName(static_cast<DType>(9)), "unknown");
}

TEST(DTypeNameTest, RejectsUnknownNamesListingTheAccepted) {
  for (const char* bad : {"", "F32", "fp8", "int8", "unknown", "f32 "}) {
    const absl::StatusOr<DType> parsed = DTypeFromName(bad);
    ASSERT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(parsed.status().message().find("f32, bf16, f16, i8, fp8_e4m3, i4"),
              absl::string_view::npos)
        << parsed.status();
  }
}

TEST(DTypeTest, SizesAndQuantizedKinds) {
  EXPECT_EQ(DTypeSize(DType::kF32), 4);
  EXPECT_EQ(DTypeSize(DType::kBF16), 2);
  EXPECT_EQ(DTypeSize(DType::kI8), 1);
  EXPECT_EQ(DTypeSize(DType::kF8E4M3), 1);
  EXPECT_EQ(DTypeSize(DType::kI4), 1);  // (its unit: a byte of two codes)
  static_assert(IsQuantizedKvDType(DType::kI8) && IsQuantizedKvDType(DType::kF8E4M3) &&
                IsQuantizedKvDType(DType::kI4));
  static_assert(!IsQuantizedKvDType(DType::kF32) && !IsQuantizedKvDType(DType::kBF16) &&
                !IsQuantizedKvDType(DType::kF16));
}

// Data, padding to 16 bytes, then one f32 scale per (layer, K|V, kv head, token).
TEST(DenseKvBlockBytesTest, QuantizedBlocksCarryTheirScales) {
  static_assert(DenseKvBlockBytes(DType::kF16, 2, 4, 16, 64) == 2 * 2 * 4 * 16 * 64 * 2);
  static_assert(DenseKvBlockBytes(DType::kI8, 2, 4, 16, 64) ==
                2 * 2 * 4 * 16 * 64 + 2 * 2 * 4 * 16 * 4);
  // 1 * 2 * 1 * 3 * 5 = 30 data bytes, padded to 32, then 6 scales.
  static_assert(DenseKvBlockBytes(DType::kF8E4M3, 1, 1, 3, 5) == 32 + 6 * 4);
  constexpr KvCacheView v = DenseKvCacheView(nullptr, DType::kI8, 7, 1, 1, 3, 5, 0);
  static_assert(v.block_stride == 56 && v.scale_offset == 32 && v.scale_head_stride == 3 &&
                v.scale_kv_stride == 3 && v.scale_layer_stride == 6);
  constexpr KvCacheView f = DenseKvCacheView(nullptr, DType::kF32, 7, 1, 1, 3, 5, 0);
  static_assert(f.block_stride == 30 && f.scale_offset == 0);
}

// i4: half-byte data (rows of head_dim / 2 bytes), padding, then one f32 scale per group of 32
// values of a row (one per row when head_dim is not a multiple of 32).
TEST(DenseKvBlockBytesTest, I4BlocksCarryGroupScales) {
  static_assert(KvRowPitch(DType::kI4, 64) == 32 && KvRowPitch(DType::kI8, 64) == 64);
  static_assert(KvScalesPerRow(DType::kI4, 64) == 2 && KvScalesPerRow(DType::kI4, 8) == 1 &&
                KvScalesPerRow(DType::kI4, 48) == 1 && KvScalesPerRow(DType::kI8, 64) == 1);
  static_assert(KvRotated(DType::kI4, 64) && KvRotated(DType::kI4, 8) &&
                !KvRotated(DType::kI4, 48) && !KvRotated(DType::kI8, 64));
  // 2 layers, 4 heads, 16 tokens, head_dim 64: 2 * 2 * 4 * 16 rows of 32 bytes and 2 scales.
  static_assert(DenseKvBlockBytes(DType::kI4, 2, 4, 16, 64) ==
                2 * 2 * 4 * 16 * 32 + 2 * 2 * 4 * 16 * 2 * 4);
  constexpr KvCacheView v = DenseKvCacheView(nullptr, DType::kI4, 7, 1, 1, 3, 64, 0);
  static_assert(v.head_stride == 3 * 32 && v.kv_stride == 96 && v.scale_offset == 192 &&
                v.scale_head_stride == 6 && v.scale_kv_stride == 6 && v.scale_layer_stride == 12 &&
                v.block_stride == 192 + 12 * 4);
}

}  // namespace
}  // namespace pd::kernels
