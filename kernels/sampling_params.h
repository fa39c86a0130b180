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
//    top_k[s] tokens (if 0 < top_k[s] < vocab_size), then the smallest prefix of those whose
//    renormalised probability mass reaches top_p[s] (if top_p[s] < 1). Candidates are ranked by
//    (logit descending, id ascending), so ties are broken deterministically.
// The draw is u = SamplingUniform(seeds[s], steps[s]); the token is the first kept id, in
// ascending id order, whose cumulative kept probability exceeds u. So the token depends only on
// the logits row and (seed, step, temperature, top_k, top_p): never on batch composition or
// thread count. NaN logits are never chosen (unless the whole row is NaN: token 0).
struct SamplingParams {
  const float* logits = nullptr;  // [num_seqs][logits_stride], first vocab_size used
  int32_t* out_tokens = nullptr;  // [num_seqs]
  int64_t num_seqs = 0;
  int64_t vocab_size = 0;
  int64_t logits_stride = 0;           // >= vocab_size
  const float* temperature = nullptr;  // [num_seqs] or nullptr (all greedy)
  const int32_t* top_k = nullptr;      // [num_seqs] or nullptr (no top-k); <= 0 disables
  const float* top_p = nullptr;        // [num_seqs] in (0, 1], or nullptr (no top-p)
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
