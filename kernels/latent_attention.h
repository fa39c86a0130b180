// LatentAttention: multi-head latent attention (MLA) in the absorbed form, scoring and summing
// the cached latent entries where they lie in the paged pool (no copy of a sequence's context
// per layer and step). See kernels/latent_attention_params.h for the layout and the math.
#pragma once

#include "absl/status/status.h"
#include "kernels/latent_attention_params.h"
#include "kernels/types.h"

namespace pd::kernels {

// out <- softmax(scale * q entry^T) entry[:, :value_dim] for every query row, on kCpu or kCuda
// (there every pointer is device memory and is not read here; the block ids are not checked;
// within f32 rounding of the CPU's, not bitwise, and not yet run on a GPU). InvalidArgument for
// null pointers, non-positive sizes, a cache view WriteKv would refuse, an entry above
// kMaxLatentEntryDim, value_dim outside (0, entry], strides smaller than a token's heads, q and
// out overlapping, a token's sequence outside [0, num_seqs), a position outside the block table,
// or a block id (of any block a query reads) outside [0, cache.num_blocks). Unimplemented when
// no backend reads cache.dtype.
absl::Status LatentAttention(const OpContext& ctx, const LatentAttentionParams& p);

}  // namespace pd::kernels
