// Mixture-of-experts routing on the host: which experts each token goes to, with what weight,
// and the tokens grouped by expert so that each expert runs one batched MLP over its tokens
// (LlamaForward's MoE block).
//
// The routing rule is Mixtral's and Qwen3-MoE's (Hugging Face's MixtralSparseMoeBlock and
// Qwen3MoeSparseMoeBlock): softmax over a token's router logits (in f32), the top k experts
// (ties: the lower expert index first), their probabilities as weights, renormalized to sum 1
// when `normalize` (Mixtral always; Qwen3-MoE when norm_topk_prob).
//
// Pure functions; thread-safe.
#pragma once

#include <cstdint>
#include <vector>

namespace pd::engine {

struct MoeRouting {
  // Per expert: the tokens routed to it (ascending) and their weights, in the same order.
  std::vector<std::vector<int32_t>> tokens;
  std::vector<std::vector<float>> weights;
  // Token-expert assignments per expert in this batch (tokens[e].size()).
  int64_t assignments(int e) const { return static_cast<int64_t>(tokens[e].size()); }
};

// Routes `num_tokens` tokens given their router logits ([num_tokens][num_experts], row-major).
// Requires 0 < top_k <= num_experts. `out` is reused across calls (its vectors keep capacity).
void RouteTokens(const float* logits, int64_t num_tokens, int num_experts, int top_k,
                 bool normalize, MoeRouting* out);

}  // namespace pd::engine
