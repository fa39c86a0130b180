// Scalar conversions between f32 and the 16-bit storage types bf16 and f16 (IEEE binary16),
// bit-exact and portable. Plain header (no Abseil; includable by nvcc-compiled code); the bulk,
// vectorised form is the Convert op in kernels/convert.h, which rounds identically.
//
// f32 -> 16 bit rounds to nearest, ties to even, keeps subnormals (no flush to zero), turns
// overflow into +-inf and any NaN into a quiet NaN of the same sign (payload truncated).
// 16 bit -> f32 is exact (a signalling NaN comes back quiet, as F16C hardware does).
#pragma once

#include <cstdint>
#include <cstring>

// The same functions run on the host and, compiled by nvcc, in CUDA kernels (the CUDA KV-cache
// writes round exactly as the CPU ones).
#if defined(__CUDACC__)
#define PD_HOST_DEVICE __host__ __device__
#else
#define PD_HOST_DEVICE
#endif

namespace pd::kernels {

PD_HOST_DEVICE inline uint32_t F32Bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
#endif
}

PD_HOST_DEVICE inline float F32FromBits(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
#endif
}

PD_HOST_DEVICE inline float Bf16ToF32(uint16_t h) {
  return F32FromBits(static_cast<uint32_t>(h) << 16);
}

PD_HOST_DEVICE inline uint16_t F32ToBf16(float f) {
  const uint32_t x = F32Bits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) {
    return static_cast<uint16_t>((x >> 16) | 0x40u);  // NaN: force the quiet bit
  }
  // Adding 0x7fff plus the lowest kept bit rounds half to even; a carry into the exponent is the
  // correct result (up to and including inf).
  return static_cast<uint16_t>((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

PD_HOST_DEVICE inline float F16ToF32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  if (exp == 0x1f) {  // inf or NaN (NaN made quiet)
    return F32FromBits(sign | 0x7f800000u | (mant << 13) | (mant != 0 ? 0x400000u : 0u));
  }
  if (exp == 0) {
    if (mant == 0) {
      return F32FromBits(sign);
    }
    // Subnormal: mant * 2^-24. Normalise so the leading one lands on bit 10.
    int e = 113;  // f32 biased exponent of 2^-14
    while ((mant & 0x400u) == 0) {
      mant <<= 1;
      --e;
    }
    return F32FromBits(sign | (static_cast<uint32_t>(e) << 23) | ((mant & 0x3ffu) << 13));
  }
  return F32FromBits(sign | ((exp + 112u) << 23) | (mant << 13));
}

PD_HOST_DEVICE inline uint16_t F32ToF16(float f) {
  const uint32_t x = F32Bits(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t abs = x & 0x7fffffffu;
  if (abs > 0x7f800000u) {
    return static_cast<uint16_t>(sign | 0x7e00u | ((abs >> 13) & 0x3ffu));  // quiet NaN
  }
  if (abs >= 0x477ff000u) {  // >= 65520 rounds to inf (65504 is the largest finite f16)
    return static_cast<uint16_t>(sign | 0x7c00u);
  }
  if (abs < 0x38800000u) {     // below 2^-14: an f16 subnormal (or zero)
    if (abs <= 0x33000000u) {  // <= 2^-25: rounds to zero (2^-25 is a tie, even is 0)
      return static_cast<uint16_t>(sign);
    }
    // value = m * 2^(e - 150); in units of 2^-24 that is m >> (126 - e), shift in [14, 24].
    const uint32_t e = abs >> 23;
    const uint32_t m = (abs & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126u - e;
    uint32_t q = m >> shift;
    const uint32_t rem = m & ((1u << shift) - 1u);
    const uint32_t half = 1u << (shift - 1u);
    if (rem > half || (rem == half && (q & 1u) != 0)) {
      ++q;  // may carry into the smallest normal, which is the right encoding
    }
    return static_cast<uint16_t>(sign | q);
  }
  uint32_t h = (abs - 0x38000000u) >> 13;  // rebias 127 -> 15, drop 13 mantissa bits
  const uint32_t rem = abs & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u) != 0)) {
    ++h;
  }
  return static_cast<uint16_t>(sign | h);
}

}  // namespace pd::kernels
