// Validation and device dispatch for Convert.
#include "kernels/convert.h"

#include "absl/strings/str_cat.h"
#include "build_config.h"
#include "common/base/status_macros.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/dispatch/validate.h"
#if PD_WITH_CUDA
#include "kernels/cuda/cuda_backend.h"
#endif

namespace pd::kernels {

using dispatch_internal::CheckDenseDType;
using dispatch_internal::IsDenseDType;
using dispatch_internal::NoBackend;
using dispatch_internal::Overlaps;

bool SupportsConvert(Device device, DType in_dtype, DType out_dtype) {
  if (!IsDenseDType(in_dtype) || !IsDenseDType(out_dtype)) {
    return false;  // quantized KV dtypes are written only by WriteKv
  }
  switch (device) {
    case Device::kCpu:
      return true;  // every pair of f32, bf16, f16
    case Device::kCuda:
      return PD_WITH_CUDA;  // every pair of f32, bf16, f16
  }
  return false;
}

absl::Status Convert(const OpContext& ctx, const ConvertParams& p) {
  if (p.n < 0) {
    return absl::InvalidArgumentError(absl::StrCat("convert: n must be >= 0, got ", p.n));
  }
  PD_RETURN_IF_ERROR(CheckDenseDType("convert", "input", p.in_dtype));
  PD_RETURN_IF_ERROR(CheckDenseDType("convert", "output", p.out_dtype));
  if (p.n == 0) {
    return absl::OkStatus();  // pointers may be null
  }
  if (p.in == nullptr || p.out == nullptr) {
    return absl::InvalidArgumentError("convert: null in or out");
  }
  if (Overlaps(p.in, p.n * DTypeSize(p.in_dtype), p.out, p.n * DTypeSize(p.out_dtype))) {
    return absl::InvalidArgumentError("convert: in and out overlap");
  }
  if (!SupportsConvert(ctx.device, p.in_dtype, p.out_dtype)) {
    return NoBackend("convert", ctx.device, p.in_dtype);
  }
#if PD_WITH_CUDA
  if (ctx.device == Device::kCuda) {
    return cuda::Convert(ctx, p);
  }
#endif
  cpu::Convert(ctx, p);
  return absl::OkStatus();
}

}  // namespace pd::kernels
