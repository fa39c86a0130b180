// The fp8 E4M3 conversions of kernels/half.h against a slow reference written from the format's
// definition (torch 1.13 on the build machine has no float8_e4m3fn to generate a table from).
#include "kernels/half.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "gtest/gtest.h"

namespace pd::kernels {
namespace {

// The value of E4M3 code `c` from the definition: (-1)^s * 2^(e - 7) * (1 + m / 8) for e > 0,
// (-1)^s * 2^-6 * (m / 8) for e = 0; S.1111.111 is NaN.
double E4M3Value(int c) {
  const int s = c >> 7, e = (c >> 3) & 15, m = c & 7;
  if (e == 15 && m == 7) {
    return NAN;
  }
  const double mag = e == 0 ? std::ldexp(m / 8.0, -6) : std::ldexp(1.0 + m / 8.0, e - 7);
  return s != 0 ? -mag : mag;
}

// Round-to-nearest-even onto the finite E4M3 values, saturating at +-448, NaN to S.1111.111.
uint8_t SlowF32ToE4M3(float f) {
  const int sign = std::signbit(f) ? 0x80 : 0;
  if (std::isnan(f)) {
    return static_cast<uint8_t>(sign | 0x7f);
  }
  const double a = std::fabs(static_cast<double>(f));
  if (a >= 448.0) {
    return static_cast<uint8_t>(sign | 0x7e);
  }
  // Codes 0..0x7e are the non-negative finite values in increasing order.
  int lo = 0;
  while (lo < 0x7e && E4M3Value(lo + 1) <= a) {
    ++lo;
  }
  int best = lo;
  if (lo < 0x7e) {
    const double d_lo = a - E4M3Value(lo), d_hi = E4M3Value(lo + 1) - a;
    if (d_hi < d_lo || (d_hi == d_lo && (lo & 1) != 0)) {
      best = lo + 1;
    }
  }
  return static_cast<uint8_t>(sign | best);
}

TEST(E4M3Test, DecodesEveryCodeByDefinition) {
  for (int c = 0; c < 256; ++c) {
    const float got = E4M3ToF32(static_cast<uint8_t>(c));
    const double want = E4M3Value(c);
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(got)) << "code " << c;
      EXPECT_EQ(std::signbit(got), c >= 0x80) << "code " << c;
    } else {
      EXPECT_EQ(static_cast<double>(got), want) << "code " << c;
      EXPECT_EQ(std::signbit(got), c >= 0x80) << "code " << c;  // -0 stays -0
    }
  }
  EXPECT_EQ(E4M3ToF32(0x7e), 448.0f);
  EXPECT_EQ(E4M3ToF32(0x01), 0.001953125f);  // 2^-9, the smallest subnormal
  EXPECT_EQ(E4M3ToF32(0x08), 0.015625f);     // 2^-6, the smallest normal
}

TEST(E4M3Test, EveryCodeRoundTrips) {
  for (int c = 0; c < 256; ++c) {
    EXPECT_EQ(F32ToE4M3(E4M3ToF32(static_cast<uint8_t>(c))), c) << "code " << c;
  }
}

TEST(E4M3Test, SaturatesAndKeepsNan) {
  EXPECT_EQ(F32ToE4M3(INFINITY), 0x7e);
  EXPECT_EQ(F32ToE4M3(-INFINITY), 0xfe);
  EXPECT_EQ(F32ToE4M3(1e30f), 0x7e);
  EXPECT_EQ(F32ToE4M3(464.0f), 0x7e);  // the tie above 448 would round to 480: saturates
  EXPECT_EQ(F32ToE4M3(-500.0f), 0xfe);
  EXPECT_EQ(F32ToE4M3(NAN), 0x7f);
  EXPECT_EQ(F32ToE4M3(-NAN), 0xff);
  EXPECT_EQ(F32ToE4M3(0.0f), 0x00);
  EXPECT_EQ(F32ToE4M3(-0.0f), 0x80);
  EXPECT_EQ(F32ToE4M3(0.0009765625f), 0x00);  // 2^-10: tie between 0 and 2^-9, even is 0
  EXPECT_EQ(F32ToE4M3(0.0029296875f), 0x02);  // 1.5 * 2^-9: tie, even is 2 * 2^-9
  EXPECT_EQ(F32ToE4M3(1e-45f), 0x00);         // f32 subnormal
  EXPECT_EQ(F32ToE4M3(1.0625f), 0x38);        // tie between 1 and 1.125: even is 1
  EXPECT_EQ(F32ToE4M3(1.1875f), 0x3a);        // tie between 1.125 and 1.25: even is 1.25
}

// Every value halfway between two adjacent codes, one f32 ulp either side of it, and a strided
// sweep over all 2^32 bit patterns (about 4.3 million inputs, every exponent and sign).
TEST(E4M3Test, MatchesSlowReference) {
  std::vector<float> inputs;
  for (int c = 0; c < 0x7e; ++c) {
    const float mid = static_cast<float>((E4M3Value(c) + E4M3Value(c + 1)) / 2);
    for (float x : {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, 1e9f)}) {
      inputs.push_back(x);
      inputs.push_back(-x);
    }
  }
  for (uint64_t bits = 0; bits <= 0xffffffffu; bits += 997) {
    inputs.push_back(F32FromBits(static_cast<uint32_t>(bits)));
  }
  int64_t mismatches = 0;
  for (float x : inputs) {
    const uint8_t want = SlowF32ToE4M3(x);
    const uint8_t got = F32ToE4M3(x);
    if (got != want && ++mismatches <= 10) {
      ADD_FAILURE() << "x " << x << " (bits 0x" << std::hex << F32Bits(x) << ") got 0x" << int(got)
                    << " want 0x" << int(want);
    }
  }
  EXPECT_EQ(mismatches, 0) << "of " << inputs.size() << " inputs";
}

}  // namespace
}  // namespace pd::kernels
