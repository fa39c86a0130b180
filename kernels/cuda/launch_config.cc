#include "kernels/cuda/launch_config.h"

#include <cmath>
#include <cstdint>

namespace pd::kernels::cuda {

float AttentionScale(float scale, int64_t head_dim) {
  return scale != 0.0f ? scale : static_cast<float>(1.0 / std::sqrt(static_cast<double>(head_dim)));
}

int CopyAccessBytes(const void* src, const void* dst, int64_t src_stride, int64_t dst_stride,
                    int64_t block_bytes) {
  const uint64_t all = reinterpret_cast<uintptr_t>(src) | reinterpret_cast<uintptr_t>(dst) |
                       static_cast<uint64_t>(src_stride) | static_cast<uint64_t>(dst_stride) |
                       static_cast<uint64_t>(block_bytes);
  for (int bytes = 16; bytes > 1; bytes /= 2) {
    if (all % static_cast<uint64_t>(bytes) == 0) {
      return bytes;
    }
  }
  return 1;
}

bool DecodeVectorLoads(const KvCacheView& c) {
  if (c.dtype != DType::kF32 && c.dtype != DType::kBF16 && c.dtype != DType::kF16) {
    return false;
  }
  const uint64_t es = static_cast<uint64_t>(DTypeSize(c.dtype));
  const uint64_t all =
      reinterpret_cast<uintptr_t>(c.base) | static_cast<uint64_t>(c.block_stride) * es |
      static_cast<uint64_t>(c.layer_stride) * es | static_cast<uint64_t>(c.kv_stride) * es |
      static_cast<uint64_t>(c.head_stride) * es | static_cast<uint64_t>(c.head_dim) * es;
  return all % kDecodeVectorBytes == 0;
}

bool MatMulNativeBf16(const MatMulParams& p) { return p.w_dtype == DType::kBF16; }

MatMulI8Workspace MatMulI8Layout(const MatMulParams& p) {
  auto align = [](int64_t n) { return (n + 255) / 256 * 256; };
  MatMulI8Workspace w;
  w.xq = 0;
  w.sx = align(p.num_rows * p.in_features);
  w.acc = align(w.sx + p.num_rows * int64_t{4});
  w.total = align(w.acc + p.num_rows * p.out_features * int64_t{4});
  return w;
}

bool MatMulI8Shape(const MatMulParams& p) { return p.in_features % 4 == 0; }

int64_t MatMulTileRows(const MatMulParams& p, int64_t tile_bytes) {
  if (p.w_dtype == DType::kF32 || MatMulNativeBf16(p) || p.w_dtype == DType::kI8) {
    return p.out_features;
  }
  const int64_t fit = tile_bytes / (p.in_features * int64_t{4});
  if (fit < 1) {
    return 1;
  }
  return fit < p.out_features ? fit : p.out_features;
}

int64_t MatMulWorkspaceBytes(const MatMulParams& p) {
  if (p.w_dtype == DType::kF32) {
    return 0;
  }
  if (MatMulNativeBf16(p)) {
    return p.num_rows * p.in_features * int64_t{2};
  }
  if (p.w_dtype == DType::kI8) {
    return MatMulI8Layout(p).total;
  }
  return MatMulTileRows(p) * p.in_features * int64_t{4};
}

GemmCall MatMulTile(const MatMulParams& p, int64_t first_out, int64_t tile_bytes) {
  const int64_t tile = MatMulTileRows(p, tile_bytes);
  const int64_t rows = p.out_features - first_out < tile ? p.out_features - first_out : tile;
  GemmCall g;
  g.m = static_cast<int>(rows);
  g.n = static_cast<int>(p.num_rows);
  g.k = static_cast<int>(p.in_features);
  g.lda = static_cast<int>(p.in_features);
  // Native bf16 and int8 read x from the workspace, packed; int8 writes its int32 sums there
  // too, packed, for the epilogue.
  const bool i8 = p.w_dtype == DType::kI8;
  g.ldb = static_cast<int>(MatMulNativeBf16(p) || i8 ? p.in_features : p.x_row_stride);
  g.ldc = static_cast<int>(i8 ? p.out_features : p.y_row_stride);
  g.y_offset = first_out;
  g.w_offset = first_out * p.in_features;
  return g;
}

}  // namespace pd::kernels::cuda
