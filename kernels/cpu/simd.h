// Thin per-ISA vector wrappers used by the CPU kernel bodies (private to kernels/cpu).
//
// Each namespace (scalar, avx2, avx512) defines `struct Simd` with the same static interface
// over a float vector `V` of kW lanes. Kernel bodies are templates written once against that
// interface and included into each namespace inside the matching PD_BEGIN_TARGET_* region, so
// every ISA gets its own compiled copy (no ODR clash, no run-time width checks).
//
// Conversions round exactly like kernels/half.h (bf16 by integer round-to-nearest-even, f16 by
// the F16C instructions, which also round to nearest even and keep subnormals), so vector and
// scalar paths store identical bits.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "kernels/cpu/isa.h"
#include "kernels/half.h"

#if PD_CPU_X86
// GCC 12's AVX-512 headers initialise "undefined" vectors from themselves (`__Y = __Y`), which
// -Wuninitialized reports at the header's lines once inlined into our code (GCC PR 105593,
// fixed in 13). Diagnostics follow source locations, so this must precede the first inclusion
// of immintrin.h in the translation unit: include simd.h before other headers that might pull it.
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ < 13
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>
#endif

namespace pd::kernels::cpu::scalar {

struct Simd {
  using V = float;
  static constexpr int kW = 1;
  static V Zero() { return 0.0f; }
  static V Set1(float x) { return x; }
  static V Load(const float* p) { return *p; }
  static V LoadN(const float* p, int n) { return n > 0 ? *p : 0.0f; }
  static void Store(float* p, V v) { *p = v; }
  static void StoreN(float* p, V v, int n) {
    if (n > 0) {
      *p = v;
    }
  }
  static V LoadBf16(const uint16_t* p) { return Bf16ToF32(*p); }
  static V LoadBf16N(const uint16_t* p, int n) { return n > 0 ? Bf16ToF32(*p) : 0.0f; }
  static V LoadF16(const uint16_t* p) { return F16ToF32(*p); }
  static V LoadF16N(const uint16_t* p, int n) { return n > 0 ? F16ToF32(*p) : 0.0f; }
  // kW codes of a quantized KV cache, decoded (not yet scaled): int8, and fp8 E4M3 times 2^-8
  // (exact; the vector decoders produce that without a multiply, the caller folds 2^8 into the
  // row's scale).
  static V LoadI8(const int8_t* p) { return static_cast<float>(*p); }
  // i4 (kernels/attention_params.h): kW codes from kW / 2 bytes, low nibble first,
  // sign-extended (not yet scaled). With kW = 1 (a code is half a byte): the byte's low code;
  // callers unpack pairs themselves.
  static V LoadI4(const uint8_t* p) { return static_cast<float>(((*p & 0xF) ^ 8) - 8); }
  static V LoadE4M3Over256(const uint8_t* p) { return E4M3ToF32(*p) * 0.00390625f; }
  static void StoreBf16(uint16_t* p, V v) { *p = F32ToBf16(v); }
  static void StoreBf16N(uint16_t* p, V v, int n) {
    if (n > 0) {
      *p = F32ToBf16(v);
    }
  }
  static void StoreF16(uint16_t* p, V v) { *p = F32ToF16(v); }
  static void StoreF16N(uint16_t* p, V v, int n) {
    if (n > 0) {
      *p = F32ToF16(v);
    }
  }
  static V Add(V a, V b) { return a + b; }
  static V Sub(V a, V b) { return a - b; }
  static V Mul(V a, V b) { return a * b; }
  static V Div(V a, V b) { return a / b; }
  static V Fmadd(V a, V b, V c) { return a * b + c; }
  static V Max(V a, V b) { return a > b ? a : b; }
  // b when a is NaN (b must not be NaN), else max(a, b).
  static V MaxIgnoreNan(V a, V b) { return a > b ? a : b; }
  // 0 where x is NaN, else v.
  static V ZeroIfNan(V x, V v) { return x == x ? v : 0.0f; }
  static float ReduceAdd(V v) { return v; }
  static float ReduceMax(V v) { return v; }
  static void Reduce4(V a, V b, V c, V d, float* out) {
    out[0] = a;
    out[1] = b;
    out[2] = c;
    out[3] = d;
  }
  static V Exp(V x) { return std::exp(x); }
  static void Prefetch(const void*) {}
};

}  // namespace pd::kernels::cpu::scalar

#if PD_CPU_X86

namespace pd::kernels::cpu {

// i4 codes (kernels/attention_params.h) of the low 8 bytes of `b`, in order: each byte's
// nibbles split, interleaved low first, sign-extended ((n ^ 8) - 8) to 16 int8 lanes. SSE2, so
// both vector Simds below use it.
inline __m128i I4CodesOf(__m128i b) {
  const __m128i nib = _mm_set1_epi8(0x0F);
  const __m128i codes =
      _mm_unpacklo_epi8(_mm_and_si128(b, nib), _mm_and_si128(_mm_srli_epi16(b, 4), nib));
  const __m128i eight = _mm_set1_epi8(8);
  return _mm_sub_epi8(_mm_xor_si128(codes, eight), eight);
}

}  // namespace pd::kernels::cpu

PD_BEGIN_TARGET_AVX2
namespace pd::kernels::cpu::avx2 {

struct Simd {
  using V = __m256;
  static constexpr int kW = 8;
  static __m256i Mask(int n) {
    const __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), idx);
  }
  static void Prefetch(const void* p) { _mm_prefetch(static_cast<const char*>(p), _MM_HINT_T0); }
  static V Zero() { return _mm256_setzero_ps(); }
  static V Set1(float x) { return _mm256_set1_ps(x); }
  static V Load(const float* p) { return _mm256_loadu_ps(p); }
  static V LoadN(const float* p, int n) { return _mm256_maskload_ps(p, Mask(n)); }
  static void Store(float* p, V v) { _mm256_storeu_ps(p, v); }
  static void StoreN(float* p, V v, int n) { _mm256_maskstore_ps(p, Mask(n), v); }
  static __m128i Load8x16(const uint16_t* p) {
    return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  }
  static __m128i Load8x16N(const uint16_t* p, int n) {
    uint16_t tmp[8] = {};
    std::memcpy(tmp, p, sizeof(uint16_t) * (n < 8 ? n : 8));
    return Load8x16(tmp);
  }
  static V Bf16Widen(__m128i h) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
  static V LoadBf16(const uint16_t* p) { return Bf16Widen(Load8x16(p)); }
  static V LoadBf16N(const uint16_t* p, int n) { return Bf16Widen(Load8x16N(p, n)); }
  static V LoadF16(const uint16_t* p) { return _mm256_cvtph_ps(Load8x16(p)); }
  static V LoadF16N(const uint16_t* p, int n) { return _mm256_cvtph_ps(Load8x16N(p, n)); }
  static V LoadI8(const int8_t* p) {
    return _mm256_cvtepi32_ps(
        _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
  }
  // As scalar::Simd says: 8 codes from 4 bytes (I4CodesOf), widened.
  static V LoadI4(const uint8_t* p) {
    int32_t word;
    std::memcpy(&word, p, sizeof(word));
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(I4CodesOf(_mm_cvtsi32_si128(word))));
  }
  // E4M3 -> f16 bits, widened exactly: the value times 2^-8 (f16's exponent bias is 8 more, and
  // its wider range holds E4M3's subnormals as f16 subnormals). Sign-extending the code to 16
  // bits and shifting left by 7 gives S S EEEE MMM 0000000; clearing bit 14 leaves the f16
  // S 0 EEEE MMM 0000000. Only S.1111.111 needs a fix-up: NaN in E4M3, 1.875 in this mapping.
  static V LoadE4M3Over256(const uint8_t* p) {
    const __m128i s =
        _mm_slli_epi16(_mm_cvtepi8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))), 7);
    const __m128i h = _mm_and_si128(s, _mm_set1_epi16(static_cast<int16_t>(0xbfff)));
    const __m128i mag = _mm_and_si128(s, _mm_set1_epi16(0x3f80));
    const __m256 nan =
        _mm256_castsi256_ps(_mm256_cvtepi16_epi32(_mm_cmpeq_epi16(mag, _mm_set1_epi16(0x3f80))));
    return _mm256_blendv_ps(_mm256_cvtph_ps(h), _mm256_set1_ps(NAN), nan);
  }
  static __m128i Bf16Narrow(V v) {
    const __m256i x = _mm256_castps_si256(v);
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(1));
    __m256i r = _mm256_add_epi32(x, _mm256_add_epi32(_mm256_set1_epi32(0x7fff), lsb));
    r = _mm256_srli_epi32(r, 16);
    const __m256i quiet_nan = _mm256_or_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(0x40));
    const __m256i is_nan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    r = _mm256_blendv_epi8(r, quiet_nan, is_nan);
    return _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
  }
  static void StoreBf16(uint16_t* p, V v) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), Bf16Narrow(v));
  }
  static void StoreBf16N(uint16_t* p, V v, int n) {
    uint16_t tmp[8];
    _mm_storeu_si128(reinterpret_cast<__m128i*>(tmp), Bf16Narrow(v));
    std::memcpy(p, tmp, sizeof(uint16_t) * (n < 8 ? n : 8));
  }
  static void StoreF16(uint16_t* p, V v) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
  }
  static void StoreF16N(uint16_t* p, V v, int n) {
    uint16_t tmp[8];
    _mm_storeu_si128(reinterpret_cast<__m128i*>(tmp),
                     _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
    std::memcpy(p, tmp, sizeof(uint16_t) * (n < 8 ? n : 8));
  }
  static V Add(V a, V b) { return _mm256_add_ps(a, b); }
  static V Sub(V a, V b) { return _mm256_sub_ps(a, b); }
  static V Mul(V a, V b) { return _mm256_mul_ps(a, b); }
  static V Div(V a, V b) { return _mm256_div_ps(a, b); }
  static V Fmadd(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
  static V Max(V a, V b) { return _mm256_max_ps(a, b); }
  static V MaxIgnoreNan(V a, V b) { return _mm256_max_ps(a, b); }  // maxps returns b on NaN
  static V ZeroIfNan(V x, V v) { return _mm256_and_ps(_mm256_cmp_ps(x, x, _CMP_ORD_Q), v); }
  static float ReduceAdd(V v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
  }
  // out[0..3] = the horizontal sums of a, b, c, d (cheaper than four ReduceAdds).
  static void Reduce4(V a, V b, V c, V d, float* out) {
    const __m256 t = _mm256_hadd_ps(_mm256_hadd_ps(a, b), _mm256_hadd_ps(c, d));
    _mm_storeu_ps(out, _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1)));
  }
  static float ReduceMax(V v) {
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
  }
  // Cephes expf: |relative error| < 2e-7 on [-87.3, 88.4]; inputs are clamped to that range
  // (so exp(-inf) gives 2^-126, not 0: callers zero masked lanes themselves).
  static V Exp(V x) {
    x = _mm256_min_ps(_mm256_max_ps(x, Set1(-87.33654f)), Set1(88.37626f));
    const V n = _mm256_round_ps(_mm256_mul_ps(x, Set1(1.44269504088896341f)),
                                _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    V r = _mm256_fnmadd_ps(n, Set1(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, Set1(-2.12194440e-4f), r);
    V p = Set1(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, Set1(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, Set1(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, Set1(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, Set1(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, Set1(5.0000001201e-1f));
    p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, Set1(1.0f)));
    const __m256i pow2 =
        _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(pow2));
  }
};

}  // namespace pd::kernels::cpu::avx2
PD_END_TARGET

PD_BEGIN_TARGET_AVX512
namespace pd::kernels::cpu::avx512 {

struct Simd {
  using V = __m512;
  static constexpr int kW = 16;
  static __mmask16 Mask(int n) {
    return n >= 16 ? static_cast<__mmask16>(0xffff) : static_cast<__mmask16>((1u << n) - 1u);
  }
  static void Prefetch(const void* p) { _mm_prefetch(static_cast<const char*>(p), _MM_HINT_T0); }
  static V Zero() { return _mm512_setzero_ps(); }
  static V Set1(float x) { return _mm512_set1_ps(x); }
  static V Load(const float* p) { return _mm512_loadu_ps(p); }
  static V LoadN(const float* p, int n) { return _mm512_maskz_loadu_ps(Mask(n), p); }
  static void Store(float* p, V v) { _mm512_storeu_ps(p, v); }
  static void StoreN(float* p, V v, int n) { _mm512_mask_storeu_ps(p, Mask(n), v); }
  static __m256i Load16x16(const uint16_t* p) {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  }
  static __m256i Load16x16N(const uint16_t* p, int n) {
    return _mm256_maskz_loadu_epi16(Mask(n), p);
  }
  static V Bf16Widen(__m256i h) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
  static V LoadBf16(const uint16_t* p) { return Bf16Widen(Load16x16(p)); }
  static V LoadBf16N(const uint16_t* p, int n) { return Bf16Widen(Load16x16N(p, n)); }
  static V LoadF16(const uint16_t* p) { return _mm512_cvtph_ps(Load16x16(p)); }
  static V LoadF16N(const uint16_t* p, int n) { return _mm512_cvtph_ps(Load16x16N(p, n)); }
  static V LoadI8(const int8_t* p) {
    return _mm512_cvtepi32_ps(
        _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
  }
  // As avx2::Simd::LoadI4, 16 codes from 8 bytes.
  static V LoadI4(const uint8_t* p) {
    return _mm512_cvtepi32_ps(
        _mm512_cvtepi8_epi32(I4CodesOf(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)))));
  }
  // As avx2::Simd::LoadE4M3Over256, 16 codes at a time.
  static V LoadE4M3Over256(const uint8_t* p) {
    const __m256i s = _mm256_slli_epi16(
        _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))), 7);
    const __m256i h = _mm256_and_si256(s, _mm256_set1_epi16(static_cast<int16_t>(0xbfff)));
    const __mmask16 nan = _mm256_cmpeq_epi16_mask(_mm256_and_si256(s, _mm256_set1_epi16(0x3f80)),
                                                  _mm256_set1_epi16(0x3f80));
    return _mm512_mask_mov_ps(_mm512_cvtph_ps(h), nan, _mm512_set1_ps(NAN));
  }
  static __m256i Bf16Narrow(V v) {
    const __m512i x = _mm512_castps_si512(v);
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(x, 16), _mm512_set1_epi32(1));
    __m512i r = _mm512_add_epi32(x, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), lsb));
    r = _mm512_srli_epi32(r, 16);
    const __m512i quiet_nan = _mm512_or_si512(_mm512_srli_epi32(x, 16), _mm512_set1_epi32(0x40));
    r = _mm512_mask_mov_epi32(r, _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), quiet_nan);
    return _mm512_cvtepi32_epi16(r);
  }
  static void StoreBf16(uint16_t* p, V v) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), Bf16Narrow(v));
  }
  static void StoreBf16N(uint16_t* p, V v, int n) {
    _mm256_mask_storeu_epi16(p, Mask(n), Bf16Narrow(v));
  }
  static void StoreF16(uint16_t* p, V v) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p),
                        _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
  static void StoreF16N(uint16_t* p, V v, int n) {
    _mm256_mask_storeu_epi16(p, Mask(n),
                             _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
  static V Add(V a, V b) { return _mm512_add_ps(a, b); }
  static V Sub(V a, V b) { return _mm512_sub_ps(a, b); }
  static V Mul(V a, V b) { return _mm512_mul_ps(a, b); }
  static V Div(V a, V b) { return _mm512_div_ps(a, b); }
  static V Fmadd(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
  static V Max(V a, V b) { return _mm512_max_ps(a, b); }
  static V MaxIgnoreNan(V a, V b) { return _mm512_max_ps(a, b); }  // maxps returns b on NaN
  static V ZeroIfNan(V x, V v) {
    return _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(x, x, _CMP_ORD_Q), v);
  }
  static float ReduceAdd(V v) {
    const __m256 s8 =
        _mm256_add_ps(_mm512_castps512_ps256(v),
                      _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
  }
  static float ReduceMax(V v) { return _mm512_reduce_max_ps(v); }
  static __m256 Half(V v) {
    return _mm256_add_ps(_mm512_castps512_ps256(v),
                         _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
  }
  // out[0..3] = the horizontal sums of a, b, c, d (cheaper than four ReduceAdds).
  static void Reduce4(V a, V b, V c, V d, float* out) {
    const __m256 t =
        _mm256_hadd_ps(_mm256_hadd_ps(Half(a), Half(b)), _mm256_hadd_ps(Half(c), Half(d)));
    _mm_storeu_ps(out, _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1)));
  }
  // Same polynomial and clamping as avx2::Simd::Exp; the power of two via scalef.
  static V Exp(V x) {
    x = _mm512_min_ps(_mm512_max_ps(x, Set1(-87.33654f)), Set1(88.37626f));
    const V n = _mm512_roundscale_ps(_mm512_mul_ps(x, Set1(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    V r = _mm512_fnmadd_ps(n, Set1(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, Set1(-2.12194440e-4f), r);
    V p = Set1(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, Set1(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, Set1(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, Set1(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, Set1(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, Set1(5.0000001201e-1f));
    p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, Set1(1.0f)));
    return _mm512_scalef_ps(p, n);
  }
};

}  // namespace pd::kernels::cpu::avx512
PD_END_TARGET

#endif  // PD_CPU_X86
