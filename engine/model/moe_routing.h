// Mixture-of-experts routing on the host: which experts each token goes to, with what weight,
// and the tokens grouped by expert so that each expert runs one batched MLP over its tokens
// (LlamaForward's MoE block).
//
// The routing rule is Mixtral's and Qwen3-MoE's (Hugging Face's MixtralSparseMoeBlock and
// Qwen3MoeSparseMoeBlock): softmax over a token's router logits (in f32), the top k experts
// (ties: the lower expert index first), their probabilities as weights, renormalized to sum 1
// when `normalize` (Mixtral always; Qwen3-MoE when norm_topk_prob).
//
// DeepSeek's rules (MoeRule): DeepSeek-V2 scores with softmax and may limit a token to the
// experts of its topk_group best groups (a group scored by its best expert); DeepSeek-V3 scores
// each expert with a sigmoid, selects with a per-expert bias added (groups scored by their best
// two), and weighs with the unbiased scores; both may scale the weights (routed_scaling_factor).
//
// Pure functions; thread-safe.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/model/model_config.h"

namespace pd::engine {

// How RouteTokens scores, selects and weighs (ModelConfig's moe_* fields). The defaults are
// Mixtral's rule without the renormalization.
struct MoeRule {
  MoeScoring scoring = MoeScoring::kSoftmax;
  MoeTopk topk = MoeTopk::kGreedy;
  int n_group = 1;         // grouped methods: equal groups of num_experts / n_group
  int topk_group = 1;      // groups a token may use; their experts must hold >= top_k
  bool normalize = false;  // weights divided by their sum (+ 1e-20 for DeepSeek's rules)
  float scale = 1.0f;      // then multiplied by this
  const float* selection_bias = nullptr;  // [num_experts] added to the scores to select (V3)
};

// The rule of `config`'s layers, with that layer's selection bias (nullptr without one).
MoeRule MoeRuleFor(const ModelConfig& config, const float* selection_bias);

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
// The same with any rule (ties: the lower group, the lower expert index first).
void RouteTokens(const float* logits, int64_t num_tokens, int num_experts, int top_k,
                 const MoeRule& rule, MoeRouting* out);

}  // namespace pd::engine
