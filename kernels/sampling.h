// Sample: next-token selection (greedy, temperature, min-p, top-k, top-p) with a counter-based
// draw; ApplyLogitEdits (logit bias and penalties) and ApplyTokenMask, which run before it.
// Validates once, then runs the implementation registered for ctx.device. See
// kernels/sampling_params.h for the exact rule (rows below kMinSamplingTemperature, 1e-5, are
// greedy on every device).
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/sampling_params.h"

namespace pd::kernels {

// Errors: InvalidArgument for null logits/out_tokens, non-positive sizes, logits_stride <
// vocab_size, a non-greedy row without seeds/steps, top_p outside (0, 1], min_p outside [0, 1]
// or NaN temperature, or a workspace smaller than SamplingWorkspaceBytes; Unimplemented when no
// backend built for ctx.device exists; Internal when a CUDA launch fails. On kCuda every array is
// device memory: dispatch checks the scalars only (the per-row checks above are the caller's; a
// non-null temperature always needs seeds and steps, InvalidArgument otherwise), a NaN temperature
// samples greedily, no workspace is needed, and vocab_size must be below 2^27. CUDA tokens equal
// the CPU's except when a draw lands within rounding of a cumulative-probability boundary, or picks
// a token below 2^-37 of the top token's weight, which CUDA never keeps
// (kernels/cuda/sampling_radix.h).
absl::Status Sample(const OpContext& ctx, const SamplingParams& p);

// Workspace bytes Sample(ctx, p) needs: 0 when p.temperature is nullptr (all greedy) or on
// kCuda, otherwise a candidate buffer of 8 * vocab_size bytes per thread that samples (at most
// min(num_seqs, threads of ctx.parallel)). Reads no array of p.
int64_t SamplingWorkspaceBytes(const OpContext& ctx, const SamplingParams& p);

bool SupportsSample(Device device);

// Applies logit edits in place (kernels/sampling_params.h, LogitEditParams), before Sample; a
// call with num_edits 0 does nothing. Errors: InvalidArgument for null pointers (with edits),
// non-positive sizes, a stride too small, or (kCpu) a row or token id out of range;
// Unimplemented when no backend built for ctx.device exists; Internal when a launch fails. On
// kCuda all three arrays are device memory (ids not checked: the caller's). Results are
// bitwise the same on every device.
absl::Status ApplyLogitEdits(const OpContext& ctx, const LogitEditParams& p);

// Applies token masks to logits in place (kernels/sampling_params.h, TokenMaskParams), before
// Sample. Errors: InvalidArgument for null pointers, non-positive sizes or strides too small;
// Unimplemented when no backend built for ctx.device exists; Internal when a launch fails. On
// kCuda both arrays are device memory.
absl::Status ApplyTokenMask(const OpContext& ctx, const TokenMaskParams& p);

}  // namespace pd::kernels
