// The scalar reference implementations: the oracle every other backend is tested against.
// Written for clarity, accumulating in double. Private to kernels/ (tests and dispatch only).
#pragma once

#include "kernels/norm_params.h"

namespace pd::kernels::reference {

// f32 only. Precondition: p validated by dispatch.
void RmsNorm(const RmsNormParams& p);

}  // namespace pd::kernels::reference
