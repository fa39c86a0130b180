#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/reference/reference_ops.h"

namespace pd::kernels::reference {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// log p of every token of one row, in double (see kernels/logprobs_params.h).
std::vector<double> RowLogProbs(const float* row, int64_t vocab) {
  std::vector<double> out(static_cast<size_t>(vocab), -kInf);
  double max_logit = -kInf;
  int64_t non_nan = 0;
  for (int64_t i = 0; i < vocab; ++i) {
    if (!std::isnan(row[i])) {
      ++non_nan;
      max_logit = std::max(max_logit, static_cast<double>(row[i]));
    }
  }
  if (non_nan == 0) {
    std::fill(out.begin(), out.end(), std::numeric_limits<double>::quiet_NaN());
    return out;
  }
  if (std::isinf(max_logit)) {
    // +inf: the +inf logits share the mass; all -inf: uniform over the non-NaN tokens.
    int64_t count = 0;
    for (int64_t i = 0; i < vocab; ++i) {
      count += row[i] == max_logit ? 1 : 0;
    }
    for (int64_t i = 0; i < vocab; ++i) {
      if (row[i] == max_logit) {
        out[static_cast<size_t>(i)] = -std::log(static_cast<double>(count));
      }
    }
    return out;
  }
  double sum = 0.0;
  for (int64_t i = 0; i < vocab; ++i) {
    if (!std::isnan(row[i])) {
      sum += std::exp(static_cast<double>(row[i]) - max_logit);  // exp(-inf) = 0
    }
  }
  const double log_sum = std::log(sum);
  for (int64_t i = 0; i < vocab; ++i) {
    if (!std::isnan(row[i]) && row[i] != -std::numeric_limits<float>::infinity()) {
      out[static_cast<size_t>(i)] = (static_cast<double>(row[i]) - max_logit) - log_sum;
    }
  }
  return out;
}

}  // namespace

void LogProbs(const LogProbsParams& p) {
  for (int64_t s = 0; s < p.num_seqs; ++s) {
    const float* row = p.logits + s * p.logits_stride;
    const std::vector<double> lp = RowLogProbs(row, p.vocab_size);
    if (p.tokens != nullptr) {
      p.out_token_logprobs[s] = static_cast<float>(lp[static_cast<size_t>(p.tokens[s])]);
    }
    if (p.top_n == 0) {
      continue;
    }
    // Every token with p > 0, fully sorted by logit then id: on that set the same order as by
    // log p (a monotone map of the logit; f32 rounding can only turn it into ties).
    std::vector<int32_t> order;
    for (int64_t i = 0; i < p.vocab_size; ++i) {
      if (lp[static_cast<size_t>(i)] > -kInf) {  // in double, so never rounded away
        order.push_back(static_cast<int32_t>(i));
      }
    }
    std::sort(order.begin(), order.end(), [row](int32_t a, int32_t b) {
      return row[a] > row[b] || (row[a] == row[b] && a < b);
    });
    for (int32_t j = 0; j < p.top_n; ++j) {
      const bool have = j < static_cast<int32_t>(order.size());
      p.out_top_ids[s * p.top_n + j] = have ? order[static_cast<size_t>(j)] : -1;
      p.out_top_logprobs[s * p.top_n + j] =
          have ? static_cast<float>(lp[static_cast<size_t>(order[static_cast<size_t>(j)])])
               : -std::numeric_limits<float>::infinity();
    }
  }
}

}  // namespace pd::kernels::reference
