// The logit edits' rule (kernels/sampling_params.h, LogitEdit), one float operation per step.
// Built with -ffp-contract=off (kernels/CMakeLists.txt): a fused multiply-subtract would round
// once where the rule rounds twice.
#include "kernels/reference/reference_ops.h"

namespace pd::kernels::reference {

void ApplyLogitEdits(const LogitEditParams& p) {
  for (int64_t i = 0; i < p.num_edits; ++i) {
    const LogitEdit& e = p.edits[i];
    float& logit = p.logits[p.rows[i] * p.logits_stride + e.token];
    float x = logit + e.bias;
    x = x > 0.0f ? x / e.repetition : x * e.repetition;
    x = x - e.frequency;
    x = x - e.presence;
    logit = x;
  }
}

}  // namespace pd::kernels::reference
