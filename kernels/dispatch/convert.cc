// Validation and device dispatch for Convert.
#include "kernels/convert.h"

#include "absl/strings/str_cat.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/dispatch/validate.h"

namespace pd::kernels {

using dispatch_internal::NoBackend;
using dispatch_internal::Overlaps;

bool SupportsConvert(Device device, DType, DType) { return device == Device::kCpu; }

absl::Status Convert(const OpContext& ctx, const ConvertParams& p) {
  if (p.n < 0) {
    return absl::InvalidArgumentError(absl::StrCat("convert: n must be >= 0, got ", p.n));
  }
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
  cpu::Convert(ctx, p);
  return absl::OkStatus();
}

}  // namespace pd::kernels
