// Validation and device dispatch for MatMul.
#include "kernels/matmul.h"

#include <cstdint>
#include <limits>

#include "absl/strings/str_cat.h"
#include "build_config.h"
#include "common/base/status_macros.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/dispatch/validate.h"
#if PD_WITH_CUDA
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/launch_config.h"
#endif

namespace pd::kernels {

using dispatch_internal::CheckDenseDType;
using dispatch_internal::IsDenseDType;
using dispatch_internal::NoBackend;
using dispatch_internal::Overlaps;
using dispatch_internal::Span;

bool SupportsMatMul(Device device, DType w_dtype) {
  if (w_dtype == DType::kI8) {
    return device == Device::kCpu || (device == Device::kCuda && PD_WITH_CUDA);
  }
  if (!IsDenseDType(w_dtype)) {
    return false;  // f32, bf16 and f16 weights, and int8 (above); fp8 is KV-cache-only
  }
  switch (device) {
    case Device::kCpu:
      return true;
    case Device::kCuda:
      return PD_WITH_CUDA;
  }
  return false;
}

int64_t MatMulWorkspaceBytes(const OpContext& ctx, const MatMulParams& p) {
  switch (ctx.device) {
    case Device::kCpu:
      return cpu::MatMulWorkspaceBytes(ctx, p);
    case Device::kCuda:
#if PD_WITH_CUDA
      return cuda::MatMulWorkspaceBytes(p);  // device memory: x in bf16, or a widened tile
#else
      return 0;
#endif
  }
  return 0;
}

absl::Status PrepareMatMul(const OpContext& ctx) {
#if PD_WITH_CUDA
  if (ctx.device == Device::kCuda) {
    return cuda::PrepareMatMul(ctx);
  }
#endif
  (void)ctx;
  return absl::OkStatus();
}

absl::Status MatMul(const OpContext& ctx, const MatMulParams& p) {
  if (p.x == nullptr || p.w == nullptr || p.y == nullptr) {
    return absl::InvalidArgumentError("matmul: null x, w or y");
  }
  if (p.w_dtype == DType::kI8) {
    if (p.w_scales == nullptr) {
      return absl::InvalidArgumentError(
          "matmul: w_scales is required with int8 weights (w_dtype i8)");
    }
    if (p.in_features > kMaxI8InFeatures) {
      return absl::InvalidArgumentError(
          absl::StrCat("matmul: in_features ", p.in_features, " above ", kMaxI8InFeatures,
                       " with int8 weights (the int32 sums could overflow)"));
    }
  } else {
    PD_RETURN_IF_ERROR(CheckDenseDType("matmul", "weight", p.w_dtype));
  }
  constexpr int64_t kMaxInt = std::numeric_limits<int32_t>::max();  // BLAS takes int
  if (p.num_rows <= 0 || p.in_features <= 0 || p.out_features <= 0 || p.num_rows > kMaxInt ||
      p.in_features > kMaxInt || p.out_features > kMaxInt) {
    return absl::InvalidArgumentError(
        absl::StrCat("matmul: num_rows, in_features and out_features must be in [1, 2^31), got ",
                     p.num_rows, ", ", p.in_features, ", ", p.out_features));
  }
  if (p.x_row_stride < p.in_features || p.y_row_stride < p.out_features ||
      p.x_row_stride > kMaxInt || p.y_row_stride > kMaxInt) {
    return absl::InvalidArgumentError(absl::StrCat("matmul: row strides (x ", p.x_row_stride,
                                                   ", y ", p.y_row_stride,
                                                   ") below the row lengths or >= 2^31"));
  }
  const int64_t y_bytes = Span(p.num_rows, p.y_row_stride, p.out_features) * 4;
  if (Overlaps(p.y, y_bytes, p.x, Span(p.num_rows, p.x_row_stride, p.in_features) * 4) ||
      Overlaps(p.y, y_bytes, p.w, p.out_features * p.in_features * DTypeSize(p.w_dtype)) ||
      (p.bias != nullptr && Overlaps(p.y, y_bytes, p.bias, p.out_features * 4))) {
    return absl::InvalidArgumentError("matmul: y overlaps x, w or bias");
  }
  if (!SupportsMatMul(ctx.device, p.w_dtype)) {
    return NoBackend("matmul", ctx.device, p.w_dtype);
  }
  const int64_t need = MatMulWorkspaceBytes(ctx, p);
  if (need > 0 && (p.workspace == nullptr || p.workspace_bytes < need)) {
    return absl::InvalidArgumentError(
        absl::StrCat("matmul: workspace of ", p.workspace_bytes, " bytes, need ", need));
  }
#if PD_WITH_CUDA
  if (ctx.device == Device::kCuda) {
    if (p.w_dtype == DType::kI8 && !cuda::MatMulI8Shape(p)) {
      return absl::InvalidArgumentError(
          absl::StrCat("matmul: in_features ", p.in_features,
                       " with int8 weights on cuda must be a multiple of 4 (cuBLAS's int8 GEMM)"));
    }
    return cuda::MatMul(ctx, p);
  }
#endif
  cpu::MatMul(ctx, p);
  return absl::OkStatus();
}

}  // namespace pd::kernels
