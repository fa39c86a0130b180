#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "kernels/reference/reference_ops.h"

namespace pd::kernels::reference {
namespace {

int32_t Greedy(const float* row, int64_t vocab) {
  int64_t best = -1;
  for (int64_t i = 0; i < vocab; ++i) {
    if (std::isnan(row[i])) {
      continue;
    }
    if (best < 0 || row[i] > row[best]) {
      best = i;
    }
  }
  return static_cast<int32_t>(std::max<int64_t>(best, 0));
}

int32_t SampleRow(const float* row, int64_t vocab, double temperature, double min_p, int32_t top_k,
                  double top_p, double u) {
  std::vector<int32_t> order;
  for (int64_t i = 0; i < vocab; ++i) {
    if (!std::isnan(row[i])) {
      order.push_back(static_cast<int32_t>(i));
    }
  }
  if (order.empty()) {
    return 0;
  }
  std::sort(order.begin(), order.end(),
            [row](int32_t a, int32_t b) { return row[a] > row[b] || (row[a] == row[b] && a < b); });
  const double max_logit = row[order[0]];
  auto weight = [&](int32_t id) {
    if (std::isinf(max_logit)) {  // +inf logits share all mass; all -inf: uniform
      return row[id] == max_logit ? 1.0 : 0.0;
    }
    return std::exp((static_cast<double>(row[id]) - max_logit) / temperature);
  };
  int64_t kept = static_cast<int64_t>(order.size());
  if (min_p > 0.0) {
    // Weights fall along the rank order: the kept tokens are a prefix of it.
    int64_t n = 0;
    while (n < kept && weight(order[n]) >= min_p) {
      ++n;
    }
    kept = std::max<int64_t>(n, 1);
  }
  if (top_k > 0 && top_k < kept) {
    kept = top_k;
  }
  if (top_p < 1.0) {
    double mass = 0.0;
    for (int64_t i = 0; i < kept; ++i) {
      mass += weight(order[i]);
    }
    double cumulative = 0.0;
    for (int64_t i = 0; i < kept; ++i) {
      cumulative += weight(order[i]);
      if (cumulative >= top_p * mass) {
        kept = i + 1;
        break;
      }
    }
  }
  // Draw in ascending id order over the kept set.
  std::vector<int32_t> ids(order.begin(), order.begin() + kept);
  std::sort(ids.begin(), ids.end());
  double total = 0.0;
  for (int32_t id : ids) {
    total += weight(id);
  }
  const double target = u * total;
  double cumulative = 0.0;
  for (int32_t id : ids) {
    cumulative += weight(id);
    if (cumulative > target) {
      return id;
    }
  }
  return ids.back();
}

}  // namespace

void Sample(const SamplingParams& p) {
  for (int64_t s = 0; s < p.num_seqs; ++s) {
    const float* row = p.logits + s * p.logits_stride;
    if (p.temperature == nullptr || IsGreedyTemperature(p.temperature[s])) {
      p.out_tokens[s] = Greedy(row, p.vocab_size);
      continue;
    }
    p.out_tokens[s] =
        SampleRow(row, p.vocab_size, p.temperature[s], p.min_p != nullptr ? p.min_p[s] : 0.0,
                  p.top_k != nullptr ? p.top_k[s] : 0, p.top_p != nullptr ? p.top_p[s] : 1.0,
                  SamplingUniform(p.seeds[s], p.steps[s]));
  }
}

}  // namespace pd::kernels::reference
