#include "kernels/convert.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/dispatch/kernel_test_util.h"
#include "kernels/half.h"
#include "kernels/reference/reference_ops.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace pd::kernels {
namespace {

using testing::CpuVariants;
using testing::VariantScope;

float Bits(uint32_t u) { return F32FromBits(u); }

TEST(HalfTest, Bf16EdgeValues) {
  EXPECT_EQ(F32ToBf16(0.0f), 0x0000);
  EXPECT_EQ(F32ToBf16(-0.0f), 0x8000);
  EXPECT_EQ(F32ToBf16(1.0f), 0x3f80);
  EXPECT_EQ(F32ToBf16(INFINITY), 0x7f80);
  EXPECT_EQ(F32ToBf16(-INFINITY), 0xff80);
  EXPECT_EQ(F32ToBf16(std::numeric_limits<float>::max()), 0x7f80);  // rounds up to inf
  // Ties to even: 1 + 2^-8 is halfway between 0x3f80 (even) and 0x3f81.
  EXPECT_EQ(F32ToBf16(Bits(0x3f808000)), 0x3f80);
  EXPECT_EQ(F32ToBf16(Bits(0x3f818000)), 0x3f82);  // halfway above odd 0x3f81: up
  EXPECT_EQ(F32ToBf16(Bits(0x3f808001)), 0x3f81);  // just above halfway
  // Subnormals round too, no flush to zero.
  EXPECT_EQ(F32ToBf16(Bits(0x00010000)), 0x0001);
  EXPECT_EQ(F32ToBf16(Bits(0x00018000)), 0x0002);  // tie, odd below: up
  EXPECT_EQ(F32ToBf16(Bits(0x00008000)), 0x0000);  // tie, even below: down
  // NaNs stay NaN (quiet), even when the payload sits only in the dropped bits.
  EXPECT_EQ(F32ToBf16(Bits(0x7f800001)), 0x7fc0);
  EXPECT_EQ(F32ToBf16(Bits(0xffc00000)), 0xffc0);
  EXPECT_TRUE(std::isnan(Bf16ToF32(0x7fc0)));
  EXPECT_EQ(Bf16ToF32(0x3f80), 1.0f);
  EXPECT_EQ(Bf16ToF32(0x0001), Bits(0x00010000));
}

TEST(HalfTest, F16EdgeValues) {
  EXPECT_EQ(F32ToF16(0.0f), 0x0000);
  EXPECT_EQ(F32ToF16(-0.0f), 0x8000);
  EXPECT_EQ(F32ToF16(1.0f), 0x3c00);
  EXPECT_EQ(F32ToF16(65504.0f), 0x7bff);
  EXPECT_EQ(F32ToF16(65519.0f), 0x7bff);
  EXPECT_EQ(F32ToF16(65520.0f), 0x7c00);  // tie at the top rounds to inf
  EXPECT_EQ(F32ToF16(1e10f), 0x7c00);
  EXPECT_EQ(F32ToF16(-INFINITY), 0xfc00);
  EXPECT_EQ(F32ToF16(std::ldexp(1.0f, -14)), 0x0400);         // smallest normal
  EXPECT_EQ(F32ToF16(std::ldexp(1.0f, -24)), 0x0001);         // smallest subnormal
  EXPECT_EQ(F32ToF16(std::ldexp(1.0f, -25)), 0x0000);         // tie: even is zero
  EXPECT_EQ(F32ToF16(std::ldexp(3.0f, -26)), 0x0001);         // 0.75 ulp: up
  EXPECT_EQ(F32ToF16(std::ldexp(3.0f, -25)), 0x0002);         // 1.5 ulp tie, odd below: up
  EXPECT_EQ(F32ToF16(std::ldexp(1023.5f, -24)), 0x0400);      // carries into the normal range
  EXPECT_EQ(F32ToF16(1.0f + std::ldexp(1.0f, -11)), 0x3c00);  // tie: even
  EXPECT_EQ(F32ToF16(1.0f + std::ldexp(3.0f, -11)), 0x3c02);  // tie above odd: up
  EXPECT_EQ(F32ToF16(Bits(0x7f800001)) & 0x7e00, 0x7e00);     // NaN stays a quiet NaN
  EXPECT_EQ(F16ToF32(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(F16ToF32(0x03ff), std::ldexp(1023.0f, -24));
  EXPECT_EQ(F16ToF32(0x7bff), 65504.0f);
  EXPECT_EQ(F16ToF32(0xfc00), -INFINITY);
  EXPECT_TRUE(std::isnan(F16ToF32(0x7c01)));
}

// Every 16-bit pattern survives 16 -> 32 -> 16 (NaNs come back as NaNs).
TEST(HalfTest, ExhaustiveRoundTrip) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const uint16_t x = static_cast<uint16_t>(h);
    const float f = F16ToF32(x);
    const float b = Bf16ToF32(x);
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(F16ToF32(F32ToF16(f)))) << h;
    } else {
      ASSERT_EQ(F32ToF16(f), x) << h;
    }
    if (std::isnan(b)) {
      EXPECT_TRUE(std::isnan(Bf16ToF32(F32ToBf16(b)))) << h;
    } else {
      ASSERT_EQ(F32ToBf16(b), x) << h;
    }
  }
}

#if defined(__x86_64__)
__attribute__((target("f16c"))) uint16_t HwF32ToF16(float f) {
  return static_cast<uint16_t>(_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT));
}
__attribute__((target("f16c"))) float HwF16ToF32(uint16_t h) { return _cvtsh_ss(h); }

// The portable f16 conversions agree bit for bit with the F16C instructions.
TEST(HalfTest, F16MatchesF16cHardware) {
  if (cpu::DetectedIsa() < cpu::Isa::kAvx2) {
    GTEST_SKIP() << "no F16C";
  }
  for (uint32_t h = 0; h < 65536; ++h) {
    ASSERT_EQ(F32Bits(F16ToF32(static_cast<uint16_t>(h))),
              F32Bits(HwF16ToF32(static_cast<uint16_t>(h))))
        << h;
  }
  std::mt19937 rng(3);
  std::vector<uint32_t> patterns;
  for (int i = 0; i < 200000; ++i) {
    patterns.push_back(rng());
  }
  for (uint32_t e = 0; e < 256; ++e) {  // every exponent, with tie and near-tie mantissas
    for (uint32_t m : {0x0u, 0x1000u, 0x1001u, 0x0fffu, 0x3000u, 0x7fffffu, 0x401000u}) {
      patterns.push_back((e << 23) | m);
      patterns.push_back(0x80000000u | (e << 23) | m);
    }
  }
  for (uint32_t u : patterns) {
    ASSERT_EQ(F32ToF16(Bits(u)), HwF32ToF16(Bits(u))) << std::hex << u;
  }
}
#endif

std::vector<uint8_t> RandomBytes(int64_t n, std::mt19937& rng) {
  std::vector<uint8_t> v(n);
  for (uint8_t& b : v) {
    b = static_cast<uint8_t>(rng());
  }
  return v;
}

// The bulk op stores exactly the reference's bits for random bit patterns (NaN, inf and
// subnormals included), every dtype pair, every ISA, with and without threads.
TEST(ConvertTest, MatchesReferenceBitForBit) {
  std::mt19937 rng(11);
  const DType dtypes[] = {DType::kF32, DType::kBF16, DType::kF16};
  for (const auto& variant : CpuVariants()) {
    VariantScope scope(variant);
    for (DType in_dt : dtypes) {
      for (DType out_dt : dtypes) {
        for (int64_t n : {0, 1, 7, 16, 17, 100, 1000, 150001}) {
          std::vector<uint8_t> in = RandomBytes(n * DTypeSize(in_dt), rng);
          std::vector<uint8_t> got(n * DTypeSize(out_dt) + 1, 0xab);
          std::vector<uint8_t> want(n * DTypeSize(out_dt) + 1, 0xab);
          ConvertParams p{in.data(), got.data(), n, in_dt, out_dt};
          ASSERT_TRUE(Convert(scope.ctx(), p).ok());
          p.out = want.data();
          reference::Convert(p);
          ASSERT_EQ(got, want) << variant.Name() << " " << static_cast<int>(in_dt) << "->"
                               << static_cast<int>(out_dt) << " n " << n;
        }
      }
    }
  }
}

TEST(ConvertTest, RejectsBadInput) {
  std::vector<float> buf(16);
  ConvertParams p{buf.data(), buf.data() + 4, 8, DType::kF32, DType::kF32};
  EXPECT_EQ(Convert(OpContext{}, p).code(), absl::StatusCode::kInvalidArgument);  // overlap
  p = ConvertParams{nullptr, buf.data(), 1, DType::kF32, DType::kBF16};
  EXPECT_EQ(Convert(OpContext{}, p).code(), absl::StatusCode::kInvalidArgument);
  p = ConvertParams{buf.data(), buf.data() + 8, -1, DType::kF32, DType::kBF16};
  EXPECT_EQ(Convert(OpContext{}, p).code(), absl::StatusCode::kInvalidArgument);
  p = ConvertParams{buf.data(), buf.data() + 8, 4, DType::kF32, DType::kBF16};
  EXPECT_TRUE(SupportsConvert(Device::kCpu, DType::kBF16, DType::kF16));
  // The quantized KV dtypes need a per-row scale: only WriteKv produces them.
  for (DType q : {DType::kI8, DType::kF8E4M3}) {
    EXPECT_FALSE(SupportsConvert(Device::kCpu, q, DType::kF32));
    EXPECT_FALSE(SupportsConvert(Device::kCpu, DType::kF32, q));
    const absl::Status in =
        Convert(OpContext{}, ConvertParams{buf.data(), buf.data() + 8, 4, q, DType::kF32});
    EXPECT_EQ(in.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(in.message().find("KV-cache-only"), absl::string_view::npos) << in;
    EXPECT_EQ(
        Convert(OpContext{}, ConvertParams{buf.data(), buf.data() + 8, 4, DType::kF32, q}).code(),
        absl::StatusCode::kInvalidArgument);
  }
  EXPECT_EQ(Convert(OpContext{}, ConvertParams{buf.data(), buf.data() + 8, 4, static_cast<DType>(9),
                                               DType::kF32})
                .code(),
            absl::StatusCode::kInvalidArgument);
  if (!SupportsConvert(Device::kCuda, DType::kBF16, DType::kF32)) {
    EXPECT_EQ(Convert(OpContext{Device::kCuda, nullptr}, p).code(),
              absl::StatusCode::kUnimplemented);
  }
}

}  // namespace
}  // namespace pd::kernels
