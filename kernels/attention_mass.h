// AttentionMass: how much attention every cached key receives from a sequence's queries, the
// score of the H2O and SnapKV KV policies (engine/scheduler/compress_policy.h). A pass of its
// own after the attention op (it reads the keys again, as f32: kernels::ReadKv), not fused
// into the attention kernels; docs/benchmarks.md measures what it costs a decode step.
#pragma once

#include "absl/status/status.h"
#include "kernels/attention_mass_params.h"
#include "kernels/types.h"

namespace pd::kernels {

// Adds each query's softmax weights to p.mass (kernels/attention_mass_params.h). kCpu and kCuda
// (which needs p.workspace; its mass is within float tolerance of the CPU's, not bitwise);
// Unimplemented naming the device otherwise. InvalidArgument for null pointers, non-positive
// sizes, num_heads not a multiple of num_kv_heads, head_dim above kMaxAttentionHeadDim, strides
// smaller than a token's heads or mass_head_stride < start_pos + num_tokens. CPU results are
// bitwise the reference's (same float operations in the same order; the kv heads run in
// parallel, each on its own mass row).
absl::Status AttentionMass(const OpContext& ctx, const AttentionMassParams& p);

}  // namespace pd::kernels
