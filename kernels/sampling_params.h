// Parameters of the Sample op (next-token selection from logits). Plain struct shared by every
// backend (included by .cu files: keep it free of Abseil and glog).
#pragma once

#include <cstdint>

#include "kernels/types.h"

namespace pd::kernels {

// Temperatures below this decode greedily, like 0 (vLLM's _SAMPLING_EPS is the same 1e-5). At
// such a temperature sampling is greedy in all but ties anyway (a logit 0.001 below the top one
// weighs e^-100 of it), and below 1 / FLT_MAX (2.9e-39, the subnormal floats) 1 / temperature
// overflows to +inf, so the float weights exp((logit - max) / temperature) would be NaN. One
// constant for the reference, CPU and CUDA samplers, so all three agree at the boundary.
inline constexpr float kMinSamplingTemperature = 1e-5f;

// Whether a row with this temperature decodes greedily: below kMinSamplingTemperature, 0, -0,
// negative, or NaN.
constexpr bool IsGreedyTemperature(float temperature) {
  return !(temperature >= kMinSamplingTemperature);
}

// For each sequence s, picks out_tokens[s] from logits[s][0, vocab_size):
//  - greedy when temperature is nullptr or IsGreedyTemperature(temperature[s]) (below 1e-5): the
//    argmax, ties to the lowest id;
//  - otherwise sampling from softmax(logits / temperature[s]) restricted to the kept set: the
//    tokens whose weight exp((logit - max logit) / temperature[s]), i.e. their probability over
//    the top token's, is at least min_p[s] (if min_p[s] > 0: vLLM's min_p), of those the top_k[s]
//    first (if 0 < top_k[s]), then the smallest prefix of those whose renormalised probability
//    mass reaches top_p[s] (if top_p[s] < 1). Candidates are ranked by (logit descending, id
//    ascending), so ties are broken deterministically; the min_p set is a prefix of that order
//    (the weight grows with the logit), so the three cuts are prefixes one after the other.
// The draw is u = SamplingUniform(seeds[s], steps[s]); the token is the first kept id, in
// ascending id order, whose cumulative kept probability exceeds u. So the token depends only on
// the logits row and (seed, step, temperature, min_p, top_k, top_p): never on batch composition
// or thread count. NaN logits are never chosen (unless the whole row is NaN: token 0). Greedy
// rows ignore min_p, top_k and top_p (the argmax is always kept).
struct SamplingParams {
  const float* logits = nullptr;  // [num_seqs][logits_stride], first vocab_size used
  int32_t* out_tokens = nullptr;  // [num_seqs]
  int64_t num_seqs = 0;
  int64_t vocab_size = 0;
  int64_t logits_stride = 0;           // >= vocab_size
  const float* temperature = nullptr;  // [num_seqs] or nullptr (all greedy)
  const int32_t* top_k = nullptr;      // [num_seqs] or nullptr (no top-k); <= 0 disables
  const float* top_p = nullptr;        // [num_seqs] in (0, 1], or nullptr (no top-p)
  const float* min_p = nullptr;        // [num_seqs] in [0, 1] (0 = off), or nullptr (no min-p)
  const uint64_t* seeds = nullptr;     // [num_seqs]; needed unless all greedy
  const uint64_t* steps = nullptr;     // [num_seqs]: index of this token within its request
  // Scratch of at least SamplingWorkspaceBytes(ctx, *this) bytes; may be nullptr when that is 0.
  void* workspace = nullptr;
  int64_t workspace_bytes = 0;
};

// Structured output's token masks: for each sequence s, every logit logits[s][t] whose bit
// (mask[s * mask_stride_words + t / 32] >> (t % 32)) & 1 is 0 becomes NaN, which Sample never
// picks (unless the row has no other) and LogProbs reports as -inf. A row whose mask is all ones
// is left as it is. Words past the vocabulary's last bit are not read.
struct TokenMaskParams {
  float* logits = nullptr;         // [num_seqs][logits_stride], first vocab_size masked
  const uint32_t* mask = nullptr;  // [num_seqs][mask_stride_words]
  int64_t num_seqs = 0;
  int64_t vocab_size = 0;
  int64_t logits_stride = 0;      // >= vocab_size
  int64_t mask_stride_words = 0;  // >= (vocab_size + 31) / 32
};

// One token's logit edit (OpenAI's logit_bias and presence/frequency penalties, vLLM's
// repetition penalty), fully resolved on the host from the request's token counts:
//   x = logit + bias;
//   x = x > 0 ? x / repetition : x * repetition;   (repetition 1: unchanged)
//   x = x - frequency;                              (frequency_penalty * count in the output)
//   x = x - presence;                               (presence_penalty if count > 0, else 0)
// each step one float operation rounded to nearest (never fused), in this order: the order
// and the float32 arithmetic of vLLM's apply_logits_bias + apply_penalties, so a dense PyTorch
// version of the same rule gives the same bits. A NaN logit (a masked token) stays NaN.
struct LogitEdit {
  int32_t token = 0;  // [0, vocab_size)
  float bias = 0.0f;
  float repetition = 1.0f;  // > 0
  float frequency = 0.0f;
  float presence = 0.0f;
};

// Applies edits[i] to logits[rows[i]][edits[i].token] in place, for i < num_edits, before
// Sample. At most one edit per (row, token) in one call (the CUDA kernel applies them in
// parallel); the order of the edits is free.
struct LogitEditParams {
  float* logits = nullptr;           // [num_seqs][logits_stride], first vocab_size edited
  const LogitEdit* edits = nullptr;  // [num_edits]
  const int32_t* rows = nullptr;     // [num_edits], each in [0, num_seqs)
  int64_t num_edits = 0;
  int64_t num_seqs = 0;
  int64_t vocab_size = 0;
  int64_t logits_stride = 0;  // >= vocab_size
};

// splitmix64 finaliser: a bijective 64-bit mixer.
constexpr uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// The uniform draw in [0, 1) for (seed, step): a counter-based hash, so it needs no RNG state
// and any worker (prefill, decode, after a restart) draws the same number for the same step.
constexpr double SamplingUniform(uint64_t seed, uint64_t step) {
  const uint64_t bits = SplitMix64(SplitMix64(seed) ^ (step * 0xd1b54a32d192ed03ull));
  return static_cast<double>(bits >> 11) * (1.0 / 9007199254740992.0);  // 53 bits / 2^53
}

}  // namespace pd::kernels
