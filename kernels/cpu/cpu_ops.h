// Optimised CPU implementations (compiler-vectorised loops; run-time ISA dispatch comes with
// the matmul kernels). Private to kernels/.
#pragma once

#include "kernels/norm_params.h"

namespace pd::kernels::cpu {

// f32 only. Precondition: p validated by dispatch.
void RmsNorm(const RmsNormParams& p);

}  // namespace pd::kernels::cpu
