// Element-wise ops: SiluMul (SwiGLU), Add and ScaledScatterAdd (a MoE expert's weighted sum).
// Validate once, then run the implementation registered for ctx.device.
#pragma once

#include "absl/status/status.h"
#include "kernels/elementwise_params.h"

namespace pd::kernels {

// Errors: InvalidArgument for null pointers, non-positive sizes, strides < dim, or outputs that
// partly overlap an input; Unimplemented when no backend built for ctx.device exists.
absl::Status SiluMul(const OpContext& ctx, const SiluMulParams& p);
absl::Status Add(const OpContext& ctx, const AddParams& p);
// num_rows == 0 does nothing (whatever the pointers). Also InvalidArgument for a null rows or
// weights array, out_rows <= 0, and (kCpu) a row out of range.
absl::Status ScaledScatterAdd(const OpContext& ctx, const ScaledScatterAddParams& p);

bool SupportsElementwise(Device device);

}  // namespace pd::kernels
