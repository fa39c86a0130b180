// MatMul with int8 weights on the CPU (W8A8, kernels/matmul_params.h): the rows of x are
// quantized into the workspace, then exact integer dot products per (row, output), split over
// output rows across ctx.parallel. Three paths, bit-identical to kernels/reference: AVX-512 VNNI
// (vpdpbusd), AVX2 (vpmaddwd on sign-extended int16: vpmaddubsw would saturate) and scalar.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/simd.h"  // first: see its note on immintrin.h

namespace pd::kernels::cpu::i8_scalar {

constexpr int kCodeOffset = 0;
constexpr int kTileW = 1;
constexpr int kTileX = 1;
constexpr int kGemvW = 1;

template <int NW, int NX>
inline void DotTile(const int8_t* w, int64_t k, const uint8_t* const* x, int32_t* dots) {
  for (int a = 0; a < NW; ++a) {
    for (int b = 0; b < NX; ++b) {
      int32_t acc = 0;
      for (int64_t i = 0; i < k; ++i) {
        acc += int32_t{static_cast<int8_t>(x[b][i])} * w[a * k + i];
      }
      dots[a * NX + b] = acc;
    }
  }
}

#include "kernels/cpu/matmul_i8_impl.inc"

void QuantizeActivationRow(const float* x, int64_t k, int64_t kpad, uint8_t* q, float* scale) {
  QuantizeActivationRowScalar(x, k, kpad, q, scale);
}

}  // namespace pd::kernels::cpu::i8_scalar

#if PD_CPU_X86
PD_BEGIN_TARGET_AVX2
namespace pd::kernels::cpu::i8_avx2 {

constexpr int kCodeOffset = 0;
constexpr int kTileW = 4;
constexpr int kTileX = 2;
constexpr int kGemvW = 8;

inline int32_t ReduceAdd(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
  return _mm_cvtsi128_si32(s);
}

// 16 inputs per step: int8 sign-extended to int16, vpmaddwd sums pairs into int32 (exact:
// |pair| <= 2 * 127 * 127); the tail of k % 16 inputs one by one.
template <int NW, int NX>
inline void DotTile(const int8_t* w, int64_t k, const uint8_t* const* x, int32_t* dots) {
  __m256i acc[NW][NX];
  for (int a = 0; a < NW; ++a) {
    for (int b = 0; b < NX; ++b) {
      acc[a][b] = _mm256_setzero_si256();
    }
  }
  int64_t i = 0;
  for (; i + 16 <= k; i += 16) {
    __m256i xv[NX];
    for (int b = 0; b < NX; ++b) {  // x rows are 64-byte aligned, i a multiple of 16
      xv[b] = _mm256_cvtepi8_epi16(_mm_load_si128(reinterpret_cast<const __m128i*>(x[b] + i)));
    }
    for (int a = 0; a < NW; ++a) {
      const int8_t* wr = w + a * k + i;
      if (i % 64 == 0) {
        _mm_prefetch(reinterpret_cast<const char*>(wr) + 1024, _MM_HINT_T0);
      }
      const __m256i wv =
          _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(wr)));
      for (int b = 0; b < NX; ++b) {
        acc[a][b] = _mm256_add_epi32(acc[a][b], _mm256_madd_epi16(wv, xv[b]));
      }
    }
  }
  for (int a = 0; a < NW; ++a) {
    for (int b = 0; b < NX; ++b) {
      int32_t d = ReduceAdd(acc[a][b]);
      for (int64_t j = i; j < k; ++j) {
        d += int32_t{static_cast<int8_t>(x[b][j])} * w[a * k + j];
      }
      dots[a * NX + b] = d;
    }
  }
}

#include "kernels/cpu/matmul_i8_impl.inc"

void QuantizeActivationRow(const float* x, int64_t k, int64_t kpad, uint8_t* q, float* scale) {
  QuantizeActivationRowScalar(x, k, kpad, q, scale);
}

}  // namespace pd::kernels::cpu::i8_avx2
PD_END_TARGET

PD_BEGIN_TARGET_AVX512VNNI
namespace pd::kernels::cpu::i8_avx512vnni {

// vpdpbusd multiplies u8 by s8: x codes are stored + 128 and the dot products corrected by
// 128 * sum(w row), summed alongside (vpdpbusd of ones). Non-saturating vpdpbusd and wrapping
// int32 lanes: the intermediate sums may wrap, the final difference is the exact dot product.
constexpr int kCodeOffset = 128;
constexpr int kTileW = 4;
constexpr int kTileX = 4;
constexpr int kGemvW = 8;

template <int NW, int NX>
inline void DotTile(const int8_t* w, int64_t k, const uint8_t* const* x, int32_t* dots) {
  __m512i acc[NW][NX];
  __m512i wsum[NW];
  for (int a = 0; a < NW; ++a) {
    wsum[a] = _mm512_setzero_si512();
    for (int b = 0; b < NX; ++b) {
      acc[a][b] = _mm512_setzero_si512();
    }
  }
  const __m512i ones = _mm512_set1_epi8(1);
  int64_t i = 0;
  for (; i + 64 <= k; i += 64) {
    __m512i xv[NX];
    for (int b = 0; b < NX; ++b) {  // x rows are 64-byte aligned and padded to 64
      xv[b] = _mm512_load_si512(x[b] + i);
    }
    for (int a = 0; a < NW; ++a) {
      const int8_t* wr = w + a * k + i;
      _mm_prefetch(reinterpret_cast<const char*>(wr) + 1024, _MM_HINT_T0);
      const __m512i wv = _mm512_loadu_si512(wr);
      wsum[a] = _mm512_dpbusd_epi32(wsum[a], ones, wv);
      for (int b = 0; b < NX; ++b) {
        acc[a][b] = _mm512_dpbusd_epi32(acc[a][b], xv[b], wv);
      }
    }
  }
  if (i < k) {  // weights masked (never read past the row); x padding multiplies zeros
    const __mmask64 m = (uint64_t{1} << (k - i)) - 1;
    __m512i xv[NX];
    for (int b = 0; b < NX; ++b) {
      xv[b] = _mm512_load_si512(x[b] + i);
    }
    for (int a = 0; a < NW; ++a) {
      const __m512i wv = _mm512_maskz_loadu_epi8(m, w + a * k + i);
      wsum[a] = _mm512_dpbusd_epi32(wsum[a], ones, wv);
      for (int b = 0; b < NX; ++b) {
        acc[a][b] = _mm512_dpbusd_epi32(acc[a][b], xv[b], wv);
      }
    }
  }
  for (int a = 0; a < NW; ++a) {
    const uint32_t offset = static_cast<uint32_t>(_mm512_reduce_add_epi32(wsum[a])) * 128u;
    for (int b = 0; b < NX; ++b) {
      dots[a * NX + b] =
          static_cast<int32_t>(static_cast<uint32_t>(_mm512_reduce_add_epi32(acc[a][b])) - offset);
    }
  }
}

#include "kernels/cpu/matmul_i8_impl.inc"

// The quantization rule, 16 values at a time (vrndscaleps rounds to nearest even, as nearbyint
// does in the default mode; max and the single multiplies are exact or correctly rounded, so the
// codes equal the scalar ones).
void QuantizeActivationRow(const float* x, int64_t k, int64_t kpad, uint8_t* q, float* scale) {
  const __m512 abs_mask = _mm512_castsi512_ps(_mm512_set1_epi32(0x7fffffff));
  const __m512 big = _mm512_set1_ps(std::numeric_limits<float>::max());
  __m512 vmax = _mm512_setzero_ps();
  __mmask16 bad = 0;
  for (int64_t i = 0; i < k; i += 16) {
    const __mmask16 m =
        k - i >= 16 ? __mmask16{0xffff} : static_cast<__mmask16>((1u << (k - i)) - 1);
    const __m512 a = _mm512_and_ps(_mm512_maskz_loadu_ps(m, x + i), abs_mask);
    bad |= _mm512_cmp_ps_mask(a, big, _CMP_NLE_UQ);  // NaN or inf
    vmax = _mm512_max_ps(vmax, a);
  }
  const float amax = _mm512_reduce_max_ps(vmax);
  if (bad != 0 || amax == 0.0f) {
    *scale = bad == 0 ? 0.0f : std::numeric_limits<float>::quiet_NaN();
    std::memset(q, kCodeOffset, static_cast<size_t>(kpad));
    return;
  }
  *scale = amax / 127.0f;
  const __m512 inv = _mm512_set1_ps(127.0f / amax);
  const __m512 lo = _mm512_set1_ps(-127.0f), hi = _mm512_set1_ps(127.0f);
  const __m512i offset = _mm512_set1_epi32(kCodeOffset);
  for (int64_t i = 0; i < kpad; i += 16) {
    const __mmask16 m =
        k - i >= 16 ? __mmask16{0xffff} : (k > i ? static_cast<__mmask16>((1u << (k - i)) - 1) : 0);
    __m512 r = _mm512_roundscale_ps(_mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + i), inv),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    r = _mm512_min_ps(_mm512_max_ps(r, lo), hi);
    const __m512i c = _mm512_add_epi32(_mm512_cvtps_epi32(r), offset);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q + i), _mm512_cvtepi32_epi8(c));
  }
}

}  // namespace pd::kernels::cpu::i8_avx512vnni
PD_END_TARGET
#endif

namespace pd::kernels::cpu {
namespace {

constexpr int64_t kAlign = 64;
// Work per chunk (multiply-adds) below which splitting across threads does not pay.
constexpr int64_t kMinChunkMacs = int64_t{1} << 16;
// Output rows per chunk are a multiple of this (the widest weight tile).
constexpr int64_t kRowGroup = 8;

enum class I8Path : uint8_t { kScalar, kAvx2, kAvx512Vnni };

I8Path ChoosePath() {
#if PD_CPU_X86
  if (UseAvx512Vnni()) {
    return I8Path::kAvx512Vnni;
  }
  if (ActiveIsa() != Isa::kScalar) {  // AVX-512 without VNNI runs the AVX2 code
    return I8Path::kAvx2;
  }
#endif
  return I8Path::kScalar;
}

int64_t PaddedK(int64_t k) { return (k + kAlign - 1) / kAlign * kAlign; }

}  // namespace

int64_t MatMulI8WorkspaceBytes(const MatMulParams& p) {
  if (p.num_rows <= 0 || p.in_features <= 0) {
    return 0;
  }
  // Codes [num_rows][PaddedK] then scales [num_rows], from a 64-byte aligned start.
  return kAlign + p.num_rows * PaddedK(p.in_features) +
         p.num_rows * static_cast<int64_t>(sizeof(float));
}

void MatMulI8(const OpContext& ctx, const MatMulParams& p) {
  const I8Path path = ChoosePath();  // once: the code layout of xq depends on it
  const int64_t k = p.in_features, kpad = PaddedK(k);
  const uintptr_t base = reinterpret_cast<uintptr_t>(p.workspace);
  auto* xq = reinterpret_cast<uint8_t*>((base + kAlign - 1) & ~uintptr_t{kAlign - 1});
  auto* sx = reinterpret_cast<float*>(xq + p.num_rows * kpad);
  ParallelRange(ctx, p.num_rows, std::max<int64_t>(1, kMinChunkMacs / k),
                [&](int64_t begin, int64_t end) {
                  for (int64_t r = begin; r < end; ++r) {
                    const float* x = p.x + r * p.x_row_stride;
                    switch (path) {
#if PD_CPU_X86
                      case I8Path::kAvx512Vnni:
                        i8_avx512vnni::QuantizeActivationRow(x, k, kpad, xq + r * kpad, sx + r);
                        break;
                      case I8Path::kAvx2:
                        i8_avx2::QuantizeActivationRow(x, k, kpad, xq + r * kpad, sx + r);
                        break;
#endif
                      default:
                        i8_scalar::QuantizeActivationRow(x, k, kpad, xq + r * kpad, sx + r);
                        break;
                    }
                  }
                });
  const int64_t groups = (p.out_features + kRowGroup - 1) / kRowGroup;
  const int64_t min_groups = std::max<int64_t>(1, kMinChunkMacs / (kRowGroup * k * p.num_rows));
  ParallelRange(ctx, groups, min_groups, [&](int64_t begin, int64_t end) {
    const int64_t o_begin = begin * kRowGroup;
    const int64_t o_end = std::min(p.out_features, end * kRowGroup);
    switch (path) {
#if PD_CPU_X86
      case I8Path::kAvx512Vnni:
        i8_avx512vnni::MatMulI8Range(p, xq, sx, kpad, o_begin, o_end);
        break;
      case I8Path::kAvx2:
        i8_avx2::MatMulI8Range(p, xq, sx, kpad, o_begin, o_end);
        break;
#endif
      default:
        i8_scalar::MatMulI8Range(p, xq, sx, kpad, o_begin, o_end);
        break;
    }
  });
}

}  // namespace pd::kernels::cpu
