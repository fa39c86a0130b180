// Convert: bulk conversion between f32, bf16 and f16 (see kernels/half.h for the rounding).
// Validates once, then runs the implementation registered for ctx.device.
#pragma once

#include "absl/status/status.h"
#include "kernels/convert_params.h"

namespace pd::kernels {

// n == 0 does nothing (pointers may then be null). Errors: InvalidArgument for null pointers,
// n < 0 or overlapping buffers; Unimplemented when
// no backend built for ctx.device supports the pair.
absl::Status Convert(const OpContext& ctx, const ConvertParams& p);

bool SupportsConvert(Device device, DType in_dtype, DType out_dtype);

}  // namespace pd::kernels
