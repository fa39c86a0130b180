// Validation and device dispatch for RMSNorm. This folder is one of the three places that read
// build_config.h.
#include <cmath>

#include "absl/strings/str_cat.h"
#include "build_config.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/norm.h"
#if PD_WITH_CUDA
#include "kernels/cuda/cuda_backend.h"
#endif

namespace pd::kernels {

bool SupportsRmsNorm(Device device, DType dtype) {
  switch (device) {
    case Device::kCpu:
      return dtype == DType::kF32;
    case Device::kCuda:
      return PD_WITH_CUDA && dtype == DType::kF32;
  }
  return false;
}

absl::Status RmsNorm(const OpContext& ctx, const RmsNormParams& p) {
  if (p.in == nullptr || p.weight == nullptr || p.out == nullptr) {
    return absl::InvalidArgumentError("rms_norm: null in, weight or out");
  }
  if (p.num_rows <= 0 || p.dim <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("rms_norm: num_rows and dim must be > 0, got ", p.num_rows, " x ", p.dim));
  }
  if (p.in_row_stride < p.dim || p.out_row_stride < p.dim) {
    return absl::InvalidArgumentError(absl::StrCat("rms_norm: row strides (", p.in_row_stride,
                                                   ", ", p.out_row_stride, ") < dim ", p.dim));
  }
  if (!std::isfinite(p.eps) || p.eps < 0) {
    return absl::InvalidArgumentError(absl::StrCat("rms_norm: eps must be finite and >= 0, got ",
                                                   p.eps));
  }
  if (!SupportsRmsNorm(ctx.device, p.dtype)) {
    return absl::UnimplementedError(absl::StrCat("rms_norm: no implementation for device ",
                                                 static_cast<int>(ctx.device), " dtype ",
                                                 static_cast<int>(p.dtype)));
  }
  if (ctx.device == Device::kCpu) {
    cpu::RmsNorm(p);
    return absl::OkStatus();
  }
#if PD_WITH_CUDA
  return cuda::RmsNorm(ctx, p);
#else
  return absl::UnimplementedError("rms_norm: built without CUDA (configure with PD_ENABLE_CUDA)");
#endif
}

}  // namespace pd::kernels
