// Status-returning wrappers of the CUDA launchers, for kernels/dispatch. No vendor headers here.
#pragma once

#include "absl/status/status.h"
#include "kernels/norm_params.h"

namespace pd::kernels::cuda {

// Queues RMSNorm on ctx.stream. Internal with the CUDA error name on a launch failure.
absl::Status RmsNorm(const OpContext& ctx, const RmsNormParams& p);

// Number of visible CUDA devices; 0 when there is no driver or no device (never an error:
// callers use it to decide whether GPU paths can run).
int VisibleDeviceCount();

}  // namespace pd::kernels::cuda
