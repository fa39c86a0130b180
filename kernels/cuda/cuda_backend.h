// Status-returning wrappers of the CUDA launchers, for kernels/dispatch. No vendor headers here.
// Each queues its work on ctx.stream (a cudaStream_t; nullptr = the default stream) and returns
// without synchronising. Errors: Internal with the CUDA / cuBLAS error name when a launch or a
// cuBLAS call fails (a fault inside a kernel surfaces at the caller's next synchronising call).
// Preconditions: params validated by kernels/dispatch; all pointers, index arrays included,
// are device memory (or host memory the device can address).
#pragma once

#include "absl/status/status.h"
#include "kernels/attention_mass_params.h"
#include "kernels/attention_params.h"
#include "kernels/convert_params.h"
#include "kernels/copy_params.h"
#include "kernels/elementwise_params.h"
#include "kernels/latent_attention_params.h"
#include "kernels/matmul_params.h"
#include "kernels/norm_params.h"
#include "kernels/rope_params.h"
#include "kernels/sampling_params.h"

namespace pd::kernels::cuda {

absl::Status RmsNorm(const OpContext& ctx, const RmsNormParams& p);
absl::Status Convert(const OpContext& ctx, const ConvertParams& p);
absl::Status SiluMul(const OpContext& ctx, const SiluMulParams& p);
absl::Status Add(const OpContext& ctx, const AddParams& p);
absl::Status ScaledScatterAdd(const OpContext& ctx, const ScaledScatterAddParams& p);
absl::Status Rope(const OpContext& ctx, const RopeParams& p);
absl::Status WriteKv(const OpContext& ctx, const WriteKvParams& p);
absl::Status ReadKv(const OpContext& ctx, const ReadKvParams& p);
absl::Status PrefillAttention(const OpContext& ctx, const PrefillAttentionParams& p);
absl::Status DecodeAttention(const OpContext& ctx, const DecodeAttentionParams& p);
absl::Status LatentAttention(const OpContext& ctx, const LatentAttentionParams& p);
absl::Status AttentionMass(const OpContext& ctx, const AttentionMassParams& p);
absl::Status GatherKvRows(const OpContext& ctx, const GatherKvRowsParams& p);
absl::Status Sample(const OpContext& ctx, const SamplingParams& p);
absl::Status ApplyTokenMask(const OpContext& ctx, const TokenMaskParams& p);
absl::Status ApplyLogitEdits(const OpContext& ctx, const LogitEditParams& p);
absl::Status CopyBlocks(const OpContext& ctx, const CopyBlocksParams& p);

// y = x w^T (+ bias) through cuBLAS sgemm on the calling thread's cuBLAS handle for the current
// device (created on first use or by PrepareMatMul, with a workspace of its own, both released
// when the thread exits). bf16/f16 weights are widened
// into p.workspace (device memory, >= MatMulWorkspaceBytes in launch_config.h) tile by tile.
absl::Status MatMul(const OpContext& ctx, const MatMulParams& p);
// The calling thread's cuBLAS handle and workspace for the current device, created now if
// missing and bound to ctx.stream (kernels/matmul.h, PrepareMatMul).
absl::Status PrepareMatMul(const OpContext& ctx);

// Number of visible CUDA devices; 0 when there is no driver or no device (never an error:
// callers use it to decide whether GPU paths can run).
int VisibleDeviceCount();

}  // namespace pd::kernels::cuda
