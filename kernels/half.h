// Scalar conversions between f32 and the 16-bit storage types bf16 and f16 (IEEE binary16), and
// the 8-bit KV-cache type fp8 E4M3, bit-exact and portable. Plain header (no Abseil; includable by
// nvcc-compiled code); the bulk, vectorised form is the Convert op in kernels/convert.h, which
// rounds identically.
//
// f32 -> 16 bit rounds to nearest, ties to even, keeps subnormals (no flush to zero), turns
// overflow into +-inf and any NaN into a quiet NaN of the same sign (payload truncated).
// 16 bit -> f32 is exact (a signalling NaN comes back quiet, as F16C hardware does).
//
// fp8 E4M3 is the OCP FP8 format of NVIDIA hardware and torch.float8_e4m3fn: sign, 4 exponent
// bits (bias 7), 3 mantissa bits; no infinities; S.1111.111 is NaN, so the largest finite
// magnitude is 448 (S.1111.110) and the smallest subnormal 2^-9. f32 -> E4M3 rounds to nearest,
// ties to even, keeps subnormals, SATURATES finite overflow and +-inf to +-448 (as the cuda_fp8
// __NV_SATFINITE conversions do) and maps any NaN to S.1111.111 of the same sign. E4M3 -> f32
// is exact (both NaN codes give a quiet NaN of their sign).
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

PD_HOST_DEVICE inline float E4M3ToF32(uint8_t code) {
  const uint32_t sign = static_cast<uint32_t>(code & 0x80u) << 24;
  const uint32_t exp = (code >> 3) & 0xfu;
  const uint32_t mant = code & 0x7u;
  if (exp == 0xf && mant == 0x7) {
    return F32FromBits(sign | 0x7fc00000u);
  }
  if (exp == 0) {
    // Subnormal (or zero): mant * 2^-9, exact in f32.
    const float magnitude = static_cast<float>(mant) * 0.001953125f;
    return F32FromBits(sign | F32Bits(magnitude));
  }
  return F32FromBits(sign | ((exp + 120u) << 23) | (mant << 20));  // rebias 7 -> 127
}

PD_HOST_DEVICE inline uint8_t F32ToE4M3(float f) {
  const uint32_t x = F32Bits(f);
  const uint32_t sign = (x >> 24) & 0x80u;
  const uint32_t abs = x & 0x7fffffffu;
  if (abs > 0x7f800000u) {
    return static_cast<uint8_t>(sign | 0x7fu);  // NaN
  }
  if (abs >= 0x43e00000u) {  // >= 448 (including inf): saturate to the largest finite
    return static_cast<uint8_t>(sign | 0x7eu);
  }
  if (abs < 0x3c800000u) {     // below 2^-6: an E4M3 subnormal (or zero)
    if (abs <= 0x3a800000u) {  // <= 2^-10, half the smallest subnormal: zero (the tie is even)
      return static_cast<uint8_t>(sign);
    }
    // value = m * 2^(e - 150); in units of 2^-9 that is m >> (141 - e), shift in [21, 24].
    const uint32_t e = abs >> 23;
    const uint32_t m = (abs & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 141u - e;
    uint32_t q = m >> shift;
    const uint32_t rem = m & ((1u << shift) - 1u);
    const uint32_t half = 1u << (shift - 1u);
    if (rem > half || (rem == half && (q & 1u) != 0)) {
      ++q;  // may carry into the smallest normal, which is the right encoding
    }
    return static_cast<uint8_t>(sign | q);
  }
  uint32_t h = (abs - 0x3c000000u) >> 20;  // rebias 127 -> 7, drop 20 mantissa bits
  const uint32_t rem = abs & 0xfffffu;
  if (rem > 0x80000u || (rem == 0x80000u && (h & 1u) != 0)) {
    ++h;  // below 448 this never reaches the NaN code 0x7f: 447.99... rounds to 448 = 0x7e
  }
  return static_cast<uint8_t>(sign | h);
}

}  // namespace pd::kernels
