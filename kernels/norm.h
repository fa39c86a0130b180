// RMSNorm: the entry point every caller uses. Validates once, then runs the implementation
// registered for ctx.device. Backends assume valid input.
#pragma once

#include "absl/status/status.h"
#include "kernels/norm_params.h"

namespace pd::kernels {

// Errors: InvalidArgument for null pointers, non-positive sizes, strides < dim or a non-finite
// or negative eps; Unimplemented when no backend built for ctx.device supports p.dtype.
absl::Status RmsNorm(const OpContext& ctx, const RmsNormParams& p);

// Whether RmsNorm(ctx, p) would find an implementation (shape checks not included).
bool SupportsRmsNorm(Device device, DType dtype);

}  // namespace pd::kernels
