// Launchers of the CUDA kernels. Included only by kernels/cuda/*.{cu,cc}; plain param headers
// and CUDA only (no Abseil, glog or protobuf under nvcc). Each queues its kernel on `stream` and
// returns the launch error (cudaSuccess when queued; kernel faults surface at the next
// synchronising call). Preconditions: params validated by kernels/dispatch; every pointer,
// including block tables, positions and other index arrays, is device memory (or host memory
// the device can address). Launch shapes come from kernels/cuda/launch_config.h.
#pragma once

#include <cuda_runtime.h>

#include "kernels/attention_mass_params.h"
#include "kernels/attention_params.h"
#include "kernels/convert_params.h"
#include "kernels/copy_params.h"
#include "kernels/elementwise_params.h"
#include "kernels/latent_attention_params.h"
#include "kernels/norm_params.h"
#include "kernels/rope_params.h"
#include "kernels/sampling_params.h"

namespace pd::kernels::cuda {

// One thread block per row; f32 only.
cudaError_t LaunchRmsNorm(const RmsNormParams& p, cudaStream_t stream);

// Any pair of f32, bf16, f16; equal dtypes copy bits. Rounds as kernels/half.h.
cudaError_t LaunchConvert(const ConvertParams& p, cudaStream_t stream);

cudaError_t LaunchSiluMul(const SiluMulParams& p, cudaStream_t stream);
cudaError_t LaunchAdd(const AddParams& p, cudaStream_t stream);
cudaError_t LaunchScaledScatterAdd(const ScaledScatterAddParams& p, cudaStream_t stream);

// y[r][o] = (accumulate ? y[r][o] : 0) + bias[o] for r < num_rows, o < out_features: the bias
// step of the cuBLAS MatMul, which then accumulates x w^T into y (beta = 1).
cudaError_t LaunchBiasInit(float* y, const float* bias, int64_t num_rows, int64_t out_features,
                           int64_t y_row_stride, bool accumulate, cudaStream_t stream);

// Both RoPE styles; angles in double as on the CPU.
cudaError_t LaunchRope(const RopeParams& p, cudaStream_t stream);

// f32, bf16 and f16 caches (stores round as kernels/half.h).
cudaError_t LaunchWriteKv(const WriteKvParams& p, cudaStream_t stream);
// Every cache dtype, values bitwise the CPU ReadKv's (ReadKvElement in launch_config.h).
cudaError_t LaunchReadKv(const ReadKvParams& p, cudaStream_t stream);
cudaError_t LaunchPrefillAttention(const PrefillAttentionParams& p, cudaStream_t stream);
// The tensor-core prefill (kernels/cuda/prefill_tc.h), for params PrefillTcEligible accepts;
// LaunchPrefillAttention calls it for those. `scale` is the resolved softmax scale.
cudaError_t LaunchPrefillAttentionTc(const PrefillAttentionParams& p, float scale,
                                     cudaStream_t stream);
// Split-KV decode attention: a split kernel then a merge kernel (launch_config.h); needs
// p.workspace of DecodeWorkspaceBytes (cudaErrorInvalidConfiguration otherwise).
cudaError_t LaunchDecodeAttention(const DecodeAttentionParams& p, cudaStream_t stream);
// MLA, absorbed (kernels/latent_attention.h): one block per (token, head); not batch invariant
// bitwise against the CPU kernel (a different order of sums), within f32 rounding of it.
// Two kernels (launch_config.h, "AttentionMass"); p.workspace holds the rows' (max, sum).
cudaError_t LaunchAttentionMass(const AttentionMassParams& p, cudaStream_t stream);
// One block per (kept row, kv head, layer), bytes as stored.
cudaError_t LaunchGatherKvRows(const GatherKvRowsParams& p, cudaStream_t stream);

cudaError_t LaunchLatentAttention(const LatentAttentionParams& p, cudaStream_t stream);

// int8 MatMul pieces (launch_config.h, MatMulI8Layout): x's rows quantized to int8 codes q
// [rows][cols] and scales [rows] by the QuantizeRowsInt8 rule (bitwise the CPU's), one block per
// row; and the epilogue y[r][o] = MatMulI8Output(acc[r][o], ...) over [rows][out].
cudaError_t LaunchQuantizeRowsI8(const float* x, int64_t rows, int64_t cols, int64_t x_row_stride,
                                 int8_t* q, float* scales, cudaStream_t stream);
cudaError_t LaunchMatMulI8Epilogue(const int32_t* acc, const float* sx, const float* w_scales,
                                   const float* bias, float* y, int64_t rows, int64_t out,
                                   int64_t y_row_stride, bool accumulate, cudaStream_t stream);

// Greedy, temperature, min-p, top-k and top-p as kernels/sampling_params.h; no workspace.
cudaError_t LaunchSample(const SamplingParams& p, cudaStream_t stream);
// Token masks (TokenMaskParams): one thread per logit.
cudaError_t LaunchApplyTokenMask(const TokenMaskParams& p, cudaStream_t stream);
// Logit edits (LogitEditParams): one thread per edit, each step rounded as the reference's
// (__fadd_rn and friends: never contracted into an FMA).
cudaError_t LaunchApplyLogitEdits(const LogitEditParams& p, cudaStream_t stream);

cudaError_t LaunchCopyBlocks(const CopyBlocksParams& p, cudaStream_t stream);

}  // namespace pd::kernels::cuda
