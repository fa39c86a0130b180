// RoPE: rotary position embedding of q and k, in place. Validates once, then runs the
// implementation registered for ctx.device.
#pragma once

#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/rope_params.h"

namespace pd::kernels {

// Errors: InvalidArgument for null pointers, non-positive sizes, an odd head_dim or one above
// kMaxRopeHeadDim, strides
// smaller than a token's heads, or (kCpu only: on kCuda positions are device memory, unchecked)
// a negative position; Unimplemented when no backend built for ctx.device exists; Internal when
// a CUDA launch fails.
absl::Status Rope(const OpContext& ctx, const RopeParams& p);

// The head_dim / 2 inverse frequencies RopeParams::inv_freq expects: theta^(-2i / head_dim),
// computed in double, then (if enabled) the Llama 3.1 rule with
// wavelen = 2 pi / f, low_wavelen = original_max / low_freq_factor, high_wavelen = original_max /
// high_freq_factor: wavelen < high_wavelen keeps f; wavelen > low_wavelen gives f / factor; in
// between, s = (original_max / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
// gives (1 - s) f / factor + s f. Call once per model. InvalidArgument for an odd or non-positive
// head_dim, theta <= 1, or scaling with factor < 1, high_freq_factor <= low_freq_factor,
// low_freq_factor <= 0 or original_max_position_embeddings <= 0.
absl::StatusOr<std::vector<float>> ComputeRopeInvFreq(const RopeFreqConfig& config);

bool SupportsRope(Device device);

}  // namespace pd::kernels
