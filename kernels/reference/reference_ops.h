// The scalar reference implementations: the oracle every other backend is tested against.
// Written for clarity, accumulating in double. Private to kernels/ (tests and dispatch only).
// Preconditions for all: p validated by dispatch. Single-threaded; they ignore OpContext.
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

namespace pd::kernels::reference {

// f32 only.
void RmsNorm(const RmsNormParams& p);

// Element by element through kernels/half.h.
void Convert(const ConvertParams& p);

// Double accumulation; ignores the workspace. int8 weights: exact int64 sums, then the f32
// epilogue of kernels/matmul_params.h (the CPU kernels match it bit for bit).
void MatMul(const MatMulParams& p);

// Angles and rotation in double.
void Rope(const RopeParams& p);

void SiluMul(const SiluMulParams& p);
void Add(const AddParams& p);
void ScaledScatterAdd(const ScaledScatterAddParams& p);

// WriteKv rounds through kernels/half.h, so a CPU implementation must match it bit for bit.
void WriteKv(const WriteKvParams& p);
void ReadKv(const ReadKvParams& p);
// Two-pass softmax in double over every visible key (no online rescaling).
void PrefillAttention(const PrefillAttentionParams& p);
void DecodeAttention(const DecodeAttentionParams& p);
// Each query's keys through ReadKv, then as PrefillAttention: two passes in double.
void LatentAttention(const LatentAttentionParams& p);

// Full sort of every row, probabilities in double; ignores the workspace.
void Sample(const SamplingParams& p);
// One edit after another, each step a separate float operation.
void ApplyLogitEdits(const LogitEditParams& p);

// Every log p of a row in double, then a full sort of the tokens with p > 0.
void LogProbs(const LogProbsParams& p);

// Byte by byte.
void CopyBlocks(const CopyBlocksParams& p);

// The float rule of kernels/attention_mass_params.h, written out (the one op here not in
// double: the CPU kernel promises its bits).
void AttentionMass(const AttentionMassParams& p);

}  // namespace pd::kernels::reference
