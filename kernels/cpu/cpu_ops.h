// Optimised CPU implementations: vector code chosen at run time (kernels/cpu/isa.h), loops split
// over ctx.parallel. Private to kernels/. Preconditions for all: p validated by dispatch.
#pragma once

#include "kernels/attention_mass_params.h"
#include "kernels/attention_params.h"
#include "kernels/convert_params.h"
#include "kernels/copy_params.h"
#include "kernels/elementwise_params.h"
#include "kernels/latent_attention_params.h"
#include "kernels/logprobs_params.h"
#include "kernels/matmul_params.h"
#include "kernels/norm_params.h"
#include "kernels/rope_params.h"
#include "kernels/sampling_params.h"

namespace pd::kernels::cpu {

// f32 only.
void RmsNorm(const RmsNormParams& p);

void Convert(const OpContext& ctx, const ConvertParams& p);

int64_t MatMulWorkspaceBytes(const OpContext& ctx, const MatMulParams& p);
void MatMul(const OpContext& ctx, const MatMulParams& p);
// One path regardless of num_rows, for tests and benchmarks (the threshold is tuned with them).
void MatMulDirectForTest(const OpContext& ctx, const MatMulParams& p);
void MatMulGemmForTest(const OpContext& ctx, const MatMulParams& p);  // workspace as below
int64_t MatMulGemmWorkspaceBytesForTest(const OpContext& ctx, const MatMulParams& p);
// int8 weights (kernels/cpu/matmul_i8.cc), called by MatMul: the quantized rows of x and their
// scales live in the workspace.
int64_t MatMulI8WorkspaceBytes(const MatMulParams& p);
void MatMulI8(const OpContext& ctx, const MatMulParams& p);

void Rope(const OpContext& ctx, const RopeParams& p);

void SiluMul(const OpContext& ctx, const SiluMulParams& p);
void Add(const OpContext& ctx, const AddParams& p);
void ScaledScatterAdd(const OpContext& ctx, const ScaledScatterAddParams& p);

void WriteKv(const OpContext& ctx, const WriteKvParams& p);
void ReadKv(const OpContext& ctx, const ReadKvParams& p);
void GatherKvRows(const OpContext& ctx, const GatherKvRowsParams& p);
void PrefillAttention(const OpContext& ctx, const PrefillAttentionParams& p);
// kernels/cpu/attention_mass.cc: the kv heads in parallel.
void AttentionMass(const OpContext& ctx, const AttentionMassParams& p);
void DecodeAttention(const OpContext& ctx, const DecodeAttentionParams& p);
// Tasks of up to 8 query rows of one sequence (heads of a token, several tokens when the heads
// are few); each chunk of entries widened once for the task's rows.
void LatentAttention(const OpContext& ctx, const LatentAttentionParams& p);

int64_t SamplingWorkspaceBytes(const OpContext& ctx, const SamplingParams& p);
void Sample(const OpContext& ctx, const SamplingParams& p);
// Rows spread over ctx.parallel.
void ApplyTokenMask(const OpContext& ctx, const TokenMaskParams& p);
// Serial: edits are few (a request's distinct tokens), and each is a few flops.
void ApplyLogitEdits(const OpContext& ctx, const LogitEditParams& p);

// Rows spread over ctx.parallel; no workspace.
void LogProbs(const OpContext& ctx, const LogProbsParams& p);

// memcpy per block, blocks spread over ctx.parallel.
void CopyBlocks(const OpContext& ctx, const CopyBlocksParams& p);

}  // namespace pd::kernels::cpu
