// MatMul on the CPU: a direct vector kernel for few rows (decode), OpenBLAS sgemm for many
// (prefill). See kernels/matmul.h for the contract and the threading choice.
#include <cblas.h>  // OpenBLAS's (x86_64-linux-gnu/openblas-pthread), for openblas_set_num_threads

#include <algorithm>
#include <cstdint>
#include <mutex>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/simd.h"
#include "kernels/cpu/vector_ops.h"

namespace pd::kernels::cpu::scalar {
#include "kernels/cpu/matmul_impl.inc"
}  // namespace pd::kernels::cpu::scalar

#if PD_CPU_X86
PD_BEGIN_TARGET_AVX2
namespace pd::kernels::cpu::avx2 {
#include "kernels/cpu/matmul_impl.inc"
}  // namespace pd::kernels::cpu::avx2
PD_END_TARGET

PD_BEGIN_TARGET_AVX512
namespace pd::kernels::cpu::avx512 {
#include "kernels/cpu/matmul_impl.inc"
}  // namespace pd::kernels::cpu::avx512
PD_END_TARGET
#endif

namespace pd::kernels::cpu {
namespace {

// When sgemm may take over from the direct kernel (only with allow_blas; measured with
// kernels/bench BM_MatMulSmallM and BM_Gemm, 2 threads, Zen 5). With AVX-512 the direct kernel wins
// at every size: Debian's OpenBLAS 0.3.21 runs its Haswell (AVX2) sgemm on this CPU, ~105 GFLOP/s
// at m = 512 against 133 (f32) / 170 (bf16 weights) for the direct kernel. With AVX2 the direct
// kernel reaches ~63 GFLOP/s at m = 512, so sgemm takes rows above kDirectMaxRows (the direct
// kernel still wins at m <= 8, where sgemm's packing dominates).
constexpr int64_t kDirectMaxRows = 8;

bool UseGemm(const MatMulParams& p) {
  return p.allow_blas && p.num_rows > kDirectMaxRows && ActiveIsa() != Isa::kAvx512;
}
// Work per direct chunk (multiply-adds) below which splitting across threads does not pay.
constexpr int64_t kMinDirectChunkMacs = int64_t{1} << 16;
// Output rows per direct chunk are a multiple of this (the kernels' weight-row tile).
constexpr int64_t kDirectRowGroup = 8;
// Widened weight tile for bf16/f16 sgemm: about this many bytes of f32 per thread.
constexpr int64_t kGemmTileBytes = int64_t{1} << 20;
constexpr int64_t kAlign = 64;

void UseSingleThreadedOpenBlas() {
  static std::once_flag once;
  // Process-wide: our ParallelFor provides the threads; OpenBLAS's own team would compete with
  // it for the same cores (and busy-waits after each call).
  std::call_once(once, [] { openblas_set_num_threads(1); });
}

int64_t GemmTileRows(int64_t k) {
  const int64_t rows = kGemmTileBytes / (k * static_cast<int64_t>(sizeof(float)));
  return std::clamp<int64_t>(rows / 16 * 16, 16, 512);
}

int GemmSlots(const OpContext& ctx, const MatMulParams& p) {
  return static_cast<int>(
      std::max<int64_t>(1, std::min<int64_t>(NumThreads(ctx), (p.out_features + 15) / 16)));
}

// y[:, o0 : o0 + n) (+)= x W[o0 : o0 + n)^T + bias, with w pointing at f32 row o0.
void SgemmColumns(const MatMulParams& p, const float* w, int64_t o0, int64_t n) {
  // Row-major y = x W^T: A = x [m][k], B^T with B = W rows [n][k].
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(p.num_rows),
              static_cast<int>(n), static_cast<int>(p.in_features), 1.0f, p.x,
              static_cast<int>(p.x_row_stride), w, static_cast<int>(p.in_features),
              p.accumulate ? 1.0f : 0.0f, p.y + o0, static_cast<int>(p.y_row_stride));
  if (p.bias != nullptr) {
    for (int64_t r = 0; r < p.num_rows; ++r) {
      PD_ISA_DISPATCH(
          AddRow(p.y + r * p.y_row_stride + o0, p.bias + o0, p.y + r * p.y_row_stride + o0, n));
    }
  }
}

void MatMulGemm(const OpContext& ctx, const MatMulParams& p) {
  UseSingleThreadedOpenBlas();
  const int slots = GemmSlots(ctx, p);
  const int64_t groups = (p.out_features + 15) / 16;
  const int64_t tile_rows = GemmTileRows(p.in_features);
  const int64_t w_size = DTypeSize(p.w_dtype);
  ParallelRange(ctx, slots, 1, [&](int64_t slot_begin, int64_t slot_end) {
    for (int64_t s = slot_begin; s < slot_end; ++s) {
      const int64_t o_begin = std::min(p.out_features, groups * s / slots * 16);
      const int64_t o_end = std::min(p.out_features, groups * (s + 1) / slots * 16);
      if (p.w_dtype == DType::kF32) {
        SgemmColumns(p, static_cast<const float*>(p.w) + o_begin * p.in_features, o_begin,
                     o_end - o_begin);
        continue;
      }
      const uintptr_t base = reinterpret_cast<uintptr_t>(p.workspace);
      float* tile = reinterpret_cast<float*>(((base + kAlign - 1) & ~uintptr_t{kAlign - 1}) +
                                             s * tile_rows * p.in_features * sizeof(float));
      for (int64_t o = o_begin; o < o_end; o += tile_rows) {
        const int64_t n = std::min(tile_rows, o_end - o);
        PD_ISA_DISPATCH(ConvertRow(static_cast<const char*>(p.w) + o * p.in_features * w_size,
                                   p.w_dtype, tile, DType::kF32, n * p.in_features));
        SgemmColumns(p, tile, o, n);
      }
    }
  });
}

void MatMulDirect(const OpContext& ctx, const MatMulParams& p) {
  const int64_t groups = (p.out_features + kDirectRowGroup - 1) / kDirectRowGroup;
  const int64_t group_macs = kDirectRowGroup * p.in_features * p.num_rows;
  const int64_t min_groups = std::max<int64_t>(1, kMinDirectChunkMacs / group_macs);
  ParallelRange(ctx, groups, min_groups, [&](int64_t begin, int64_t end) {
    const int64_t o_begin = begin * kDirectRowGroup;
    const int64_t o_end = std::min(p.out_features, end * kDirectRowGroup);
    PD_ISA_DISPATCH(MatMulDirectRange(p, o_begin, o_end));
  });
}

}  // namespace

int64_t MatMulGemmWorkspaceBytesForTest(const OpContext& ctx, const MatMulParams& p) {
  if (p.w_dtype == DType::kF32 || p.in_features <= 0) {
    return 0;
  }
  return GemmSlots(ctx, p) * GemmTileRows(p.in_features) * p.in_features *
             static_cast<int64_t>(sizeof(float)) +
         kAlign;
}

int64_t MatMulWorkspaceBytes(const OpContext& ctx, const MatMulParams& p) {
  if (p.w_dtype == DType::kI8) {
    return MatMulI8WorkspaceBytes(p);
  }
  return UseGemm(p) ? MatMulGemmWorkspaceBytesForTest(ctx, p) : 0;
}

void MatMulDirectForTest(const OpContext& ctx, const MatMulParams& p) { MatMulDirect(ctx, p); }
void MatMulGemmForTest(const OpContext& ctx, const MatMulParams& p) { MatMulGemm(ctx, p); }

void MatMul(const OpContext& ctx, const MatMulParams& p) {
  if (p.w_dtype == DType::kI8) {
    MatMulI8(ctx, p);
  } else if (UseGemm(p)) {
    MatMulGemm(ctx, p);
  } else {
    MatMulDirect(ctx, p);
  }
}

}  // namespace pd::kernels::cpu
