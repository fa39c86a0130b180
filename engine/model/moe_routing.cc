#include "engine/model/moe_routing.h"

#include <algorithm>
#include <cmath>

namespace pd::engine {

MoeRule MoeRuleFor(const ModelConfig& c, const float* selection_bias) {
  MoeRule rule;
  rule.scoring = c.moe_scoring;
  rule.topk = c.moe_topk;
  rule.n_group = c.moe_n_group;
  rule.topk_group = c.moe_topk_group;
  rule.normalize = c.moe_norm_topk;
  rule.scale = c.moe_routed_scale;
  rule.selection_bias = selection_bias;
  return rule;
}

void RouteTokens(const float* logits, int64_t num_tokens, int num_experts, int top_k,
                 bool normalize, MoeRouting* out) {
  MoeRule rule;
  rule.normalize = normalize;
  RouteTokens(logits, num_tokens, num_experts, top_k, rule, out);
}

void RouteTokens(const float* logits, int64_t num_tokens, int num_experts, int top_k,
                 const MoeRule& rule, MoeRouting* out) {
  out->tokens.resize(static_cast<size_t>(num_experts));
  out->weights.resize(static_cast<size_t>(num_experts));
  for (int e = 0; e < num_experts; ++e) {
    out->tokens[e].clear();
    out->weights[e].clear();
  }
  const bool grouped = rule.topk != MoeTopk::kGreedy;
  const int group_size = grouped ? num_experts / rule.n_group : num_experts;
  std::vector<float> probs(static_cast<size_t>(num_experts));
  std::vector<float> choice(static_cast<size_t>(num_experts));
  std::vector<int> order(static_cast<size_t>(num_experts));
  std::vector<float> group_score(static_cast<size_t>(grouped ? rule.n_group : 0));
  std::vector<int> groups(group_score.size());
  std::vector<char> allowed(static_cast<size_t>(num_experts));
  for (int64_t t = 0; t < num_tokens; ++t) {
    const float* row = logits + t * num_experts;
    if (rule.scoring == MoeScoring::kSigmoid) {
      for (int e = 0; e < num_experts; ++e) probs[e] = 1.0f / (1.0f + std::exp(-row[e]));
    } else {
      float max = row[0];
      for (int e = 1; e < num_experts; ++e) max = std::max(max, row[e]);
      float sum = 0;
      for (int e = 0; e < num_experts; ++e) {
        probs[e] = std::exp(row[e] - max);
        sum += probs[e];
      }
      for (int e = 0; e < num_experts; ++e) probs[e] /= sum;
    }
    // What the top k is taken over: the scores, plus DeepSeek-V3's selection bias.
    for (int e = 0; e < num_experts; ++e) {
      choice[e] = rule.selection_bias != nullptr ? probs[e] + rule.selection_bias[e] : probs[e];
    }
    int candidates = num_experts;
    for (int e = 0; e < num_experts; ++e) order[e] = e;
    if (grouped) {
      // Each group's score: its best expert (V2), or the sum of its best two (V3); the token may
      // use the experts of the topk_group best groups only (the others are excluded, as
      // DeepSeek's and vLLM's code do; Hugging Face's masks them with 0 instead, which picks
      // the same experts while the kept ones' scores are positive).
      for (int g = 0; g < rule.n_group; ++g) {
        const float* s = &choice[static_cast<size_t>(g) * group_size];
        if (rule.topk == MoeTopk::kGroupLimited) {
          group_score[g] = *std::max_element(s, s + group_size);
        } else {
          float first = -INFINITY, second = -INFINITY;
          for (int i = 0; i < group_size; ++i) {
            if (s[i] > first) {
              second = first;
              first = s[i];
            } else if (s[i] > second) {
              second = s[i];
            }
          }
          group_score[g] = first + second;
        }
        groups[g] = g;
      }
      std::partial_sort(
          groups.begin(), groups.begin() + rule.topk_group, groups.end(), [&](int a, int b) {
            return group_score[a] > group_score[b] || (group_score[a] == group_score[b] && a < b);
          });
      std::fill(allowed.begin(), allowed.end(), 0);
      for (int i = 0; i < rule.topk_group; ++i) {
        std::fill_n(allowed.begin() + static_cast<size_t>(groups[i]) * group_size, group_size, 1);
      }
      candidates = 0;
      for (int e = 0; e < num_experts; ++e) {
        if (allowed[e]) order[candidates++] = e;  // ascending, so ties still prefer lower ids
      }
    }
    std::partial_sort(
        order.begin(), order.begin() + top_k, order.begin() + candidates,
        [&](int a, int b) { return choice[a] > choice[b] || (choice[a] == choice[b] && a < b); });
    float chosen = 0;
    for (int i = 0; i < top_k; ++i) chosen += probs[order[i]];
    // Mixtral and Qwen3-MoE divide by the sum; DeepSeek's grouped rules by the sum + 1e-20,
    // which in f32 is the same number for any sum of k scores that is not itself tiny.
    const float denominator = rule.selection_bias != nullptr || grouped ? chosen + 1e-20f : chosen;
    for (int i = 0; i < top_k; ++i) {
      const int e = order[i];
      float weight = rule.normalize ? probs[e] / denominator : probs[e];
      if (rule.scale != 1.0f) weight *= rule.scale;
      out->tokens[e].push_back(static_cast<int32_t>(t));
      out->weights[e].push_back(weight);
    }
  }
}

}  // namespace pd::engine
