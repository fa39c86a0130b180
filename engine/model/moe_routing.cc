#include "engine/model/moe_routing.h"

#include <algorithm>
#include <cmath>

namespace pd::engine {

void RouteTokens(const float* logits, int64_t num_tokens, int num_experts, int top_k,
                 bool normalize, MoeRouting* out) {
  out->tokens.resize(static_cast<size_t>(num_experts));
  out->weights.resize(static_cast<size_t>(num_experts));
  for (int e = 0; e < num_experts; ++e) {
    out->tokens[e].clear();
    out->weights[e].clear();
  }
  std::vector<float> probs(static_cast<size_t>(num_experts));
  std::vector<int> order(static_cast<size_t>(num_experts));
  for (int64_t t = 0; t < num_tokens; ++t) {
    const float* row = logits + t * num_experts;
    float max = row[0];
    for (int e = 1; e < num_experts; ++e) max = std::max(max, row[e]);
    float sum = 0;
    for (int e = 0; e < num_experts; ++e) {
      probs[e] = std::exp(row[e] - max);
      sum += probs[e];
    }
    for (int e = 0; e < num_experts; ++e) probs[e] /= sum;
    for (int e = 0; e < num_experts; ++e) order[e] = e;
    std::partial_sort(order.begin(), order.begin() + top_k, order.end(), [&](int a, int b) {
      return probs[a] > probs[b] || (probs[a] == probs[b] && a < b);
    });
    float chosen = 0;
    for (int i = 0; i < top_k; ++i) chosen += probs[order[i]];
    for (int i = 0; i < top_k; ++i) {
      const int e = order[i];
      out->tokens[e].push_back(static_cast<int32_t>(t));
      out->weights[e].push_back(normalize ? probs[e] / chosen : probs[e]);
    }
  }
}

}  // namespace pd::engine
