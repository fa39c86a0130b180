// Logit edits on the CPU: the reference's arithmetic (kernels/sampling_params.h, LogitEdit),
// compiled without contraction (kernels/CMakeLists.txt) so every step rounds as the rule says.
// Serial: a step's edits are a few thousand at most, a few flops each.
#include "kernels/cpu/cpu_ops.h"

namespace pd::kernels::cpu {

void ApplyLogitEdits(const OpContext& /*ctx*/, const LogitEditParams& p) {
  for (int64_t i = 0; i < p.num_edits; ++i) {
    const LogitEdit& e = p.edits[i];
    float* logit = p.logits + p.rows[i] * p.logits_stride + e.token;
    float x = *logit + e.bias;
    x = x > 0.0f ? x / e.repetition : x * e.repetition;
    x = x - e.frequency;
    x = x - e.presence;
    *logit = x;
  }
}

}  // namespace pd::kernels::cpu
