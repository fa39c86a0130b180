// LogProbs on the CPU: per row a vector max, a vector sum of exp(x - max) accumulated in double
// (the max-subtracted logsumexp) and a vector-filtered scan for the top-N; rows spread over
// ctx.parallel. A row's result depends only on the row.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/simd.h"

namespace pd::kernels::cpu::logprobs_internal {

struct TopEntry {
  float logit;
  int32_t id;
};

}  // namespace pd::kernels::cpu::logprobs_internal

namespace pd::kernels::cpu::scalar {
#include "kernels/cpu/logprobs_impl.inc"
}  // namespace pd::kernels::cpu::scalar

#if PD_CPU_X86
PD_BEGIN_TARGET_AVX2
namespace pd::kernels::cpu::avx2 {
#include "kernels/cpu/logprobs_impl.inc"
}  // namespace pd::kernels::cpu::avx2
PD_END_TARGET

PD_BEGIN_TARGET_AVX512
namespace pd::kernels::cpu::avx512 {
#include "kernels/cpu/logprobs_impl.inc"
}  // namespace pd::kernels::cpu::avx512
PD_END_TARGET
#endif

namespace pd::kernels::cpu {
namespace {

using logprobs_internal::TopEntry;

constexpr float kInf = std::numeric_limits<float>::infinity();

// The distribution of one row (kernels/logprobs_params.h): tokens with logit >= lo have p > 0.
struct RowDistribution {
  bool defined = true;  // false: every logit is NaN
  float lo = -std::numeric_limits<float>::max();
  float max_logit = 0.0f;
  bool uniform = false;        // +inf or all -inf: log p = uniform_logprob on the support
  double uniform_logprob = 0;  // -log(count)
  double log_sum = 0.0;        // log sum exp(x - max_logit) otherwise

  float LogProb(float v) const {
    if (!defined) {
      return std::numeric_limits<float>::quiet_NaN();
    }
    if (!(v >= lo)) {
      return -kInf;  // NaN, or outside the support
    }
    if (uniform) {
      return static_cast<float>(uniform_logprob);
    }
    return static_cast<float>((static_cast<double>(v) - max_logit) - log_sum);
  }
};

RowDistribution Analyse(const float* row, int64_t vocab) {
  RowDistribution d;
  PD_ISA_DISPATCH(RowMax(row, vocab, &d.max_logit));
  if (std::isinf(d.max_logit)) {
    // All mass on the +inf logits, or (max -inf) uniform over the non-NaN ones. Rare: scalar.
    const float m = d.max_logit;
    int64_t count = 0;
    for (int64_t i = 0; i < vocab; ++i) {
      count += row[i] == m ? 1 : 0;
    }
    if (count == 0) {  // max -inf and no -inf logit: all NaN
      d.defined = false;
      return d;
    }
    d.lo = m;
    d.uniform = true;
    d.uniform_logprob = -std::log(static_cast<double>(count));
    return d;
  }
  double sum = 0.0;
  PD_ISA_DISPATCH(SumExp(row, vocab, d.max_logit, &sum));
  d.log_sum = std::log(sum);
  return d;
}

void Row(const LogProbsParams& p, int64_t s) {
  const float* row = p.logits + s * p.logits_stride;
  const RowDistribution d = Analyse(row, p.vocab_size);
  if (p.tokens != nullptr) {
    p.out_token_logprobs[s] = d.LogProb(row[p.tokens[s]]);
  }
  if (p.top_n == 0) {
    return;
  }
  TopEntry top[kMaxTopLogprobs];
  int32_t count = 0;
  if (d.defined) {
    PD_ISA_DISPATCH(ScanTop(row, p.vocab_size, d.lo, p.top_n, top, &count));
  }
  int32_t* ids = p.out_top_ids + s * p.top_n;
  float* logprobs = p.out_top_logprobs + s * p.top_n;
  for (int32_t j = 0; j < p.top_n; ++j) {
    ids[j] = j < count ? top[j].id : -1;
    logprobs[j] = j < count ? d.LogProb(top[j].logit) : -kInf;
  }
}

}  // namespace

void LogProbs(const OpContext& ctx, const LogProbsParams& p) {
  ParallelRange(ctx, p.num_seqs, 1, [&](int64_t begin, int64_t end) {
    for (int64_t s = begin; s < end; ++s) {
      Row(p, s);
    }
  });
}

}  // namespace pd::kernels::cpu
