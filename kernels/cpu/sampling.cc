// Sampling on the CPU: one row per task, rows spread over ctx.parallel, each thread with its own
// slice of the workspace. The result depends only on the row and its (seed, step, temperature,
// min_p, top_k, top_p), never on which thread ran it.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/simd.h"

namespace pd::kernels::cpu::scalar {
#include "kernels/cpu/sampling_impl.inc"
}  // namespace pd::kernels::cpu::scalar

#if PD_CPU_X86
PD_BEGIN_TARGET_AVX2
namespace pd::kernels::cpu::avx2 {
#include "kernels/cpu/sampling_impl.inc"
}  // namespace pd::kernels::cpu::avx2
PD_END_TARGET

PD_BEGIN_TARGET_AVX512
namespace pd::kernels::cpu::avx512 {
#include "kernels/cpu/sampling_impl.inc"
}  // namespace pd::kernels::cpu::avx512
PD_END_TARGET
#endif

namespace pd::kernels::cpu {
namespace {

struct Candidate {
  float logit;
  int32_t id;
};

// Rank order: higher logit first, then lower id. A strict total order on non-NaN candidates.
inline bool Before(const Candidate& a, const Candidate& b) {
  return a.logit > b.logit || (a.logit == b.logit && a.id < b.id);
}

constexpr int64_t kBytesPerCandidate = sizeof(Candidate) + sizeof(float);  // + its weight

int32_t Greedy(const float* row, int64_t vocab) {
  int64_t best = -1;
  float best_logit = 0.0f;
  for (int64_t i = 0; i < vocab; ++i) {
    const float v = row[i];
    if (v != v) {
      continue;  // NaN
    }
    if (best < 0 || v > best_logit) {
      best = i;
      best_logit = v;
    }
  }
  return static_cast<int32_t>(std::max<int64_t>(best, 0));
}

// Weights lie in [0, 1] (the max logit has weight 1). Bucket b holds weights with binary
// exponent -b, i.e. [2^-b, 2^(1-b)); zero and subnormal weights go to the last bucket. Rank
// order (logit descending) implies bucket order, so a prefix of the rank order is contained in
// a prefix of the buckets: a histogram pass bounds which candidates need sorting.
constexpr int kBuckets = 128;

inline int Bucket(float w) {
  uint32_t bits;
  std::memcpy(&bits, &w, sizeof(bits));
  const int e = static_cast<int>(bits >> 23);  // w >= 0
  return std::clamp(127 - e, 0, kBuckets - 1);
}

// `scratch` holds vocab Candidates followed by vocab floats.
int32_t SampleRow(const float* row, int64_t vocab, float temperature, float min_p, int32_t top_k,
                  float top_p, double u, void* scratch) {
  auto* cand = static_cast<Candidate*>(scratch);
  float* weight = reinterpret_cast<float*>(cand + vocab);
  float max_logit = 0.0f;
  PD_ISA_DISPATCH(MaxLogit(row, vocab, &max_logit));
  // NaN logits only matter for the top-k count and the all-NaN row; count them only when the
  // row has no finite maximum or top-k could reach them.
  int64_t n = vocab;
  if (max_logit == -std::numeric_limits<float>::infinity() || (top_k > 0 && top_k < vocab)) {
    n = 0;
    for (int64_t i = 0; i < vocab; ++i) {
      n += row[i] == row[i] ? 1 : 0;
    }
    if (n == 0) {
      return 0;
    }
  }
  if (std::isinf(max_logit)) {
    // All mass on the +inf logits (or, all -inf, uniform over them): weights 1 or 0.
    for (int64_t i = 0; i < vocab; ++i) {
      weight[i] = row[i] == max_logit ? 1.0f : 0.0f;
    }
  } else {
    PD_ISA_DISPATCH(SoftmaxWeights(row, vocab, max_logit, 1.0f / temperature, weight));
  }
  if (min_p > 0.0f) {
    // min-p keeps the tokens whose weight (probability over the top token's) is at least
    // min_p: a prefix of the rank order, so it is a top-k cut with k = their number (NaN
    // logits weigh 0 and never count; the top token weighs 1 and always does).
    int64_t kept = 0;
    int64_t numbers = 0;      // non-NaN logits
    double kept_mass = 0.0;  // in ascending id order, as the draw below sums
    for (int64_t i = 0; i < vocab; ++i) {
      const bool keep = weight[i] >= min_p;
      kept += keep ? 1 : 0;
      kept_mass += keep ? weight[i] : 0.0f;
      numbers += row[i] == row[i] ? 1 : 0;
    }
    if (kept > 0 && kept < numbers && (top_k <= 0 || kept < top_k) && top_p >= 1.0f) {
      // min_p alone decides: the kept tokens are those whose weight is at least min_p (as
      // vLLM defines it; the prefix of the rank order the cut below finds by sorting, unless
      // the vector exp rounds two neighbours out of order by an ulp right at min_p), drawn in
      // ascending id order with the same sums as there, without collecting and sorting
      // thousands of candidates (a flat distribution keeps most of the vocabulary: with min_p
      // 0.05 a random 32k-vocabulary model served less than half the tokens per second before
      // this path; docs/benchmarks.md).
      const double target = u * kept_mass;
      double cumulative = 0.0;
      int32_t chosen = 0;
      for (int64_t i = 0; i < vocab; ++i) {
        if (weight[i] >= min_p) {
          cumulative += weight[i];
          chosen = static_cast<int32_t>(i);
          if (cumulative > target) {
            break;
          }
        }
      }
      return chosen;
    }
    kept = std::max<int64_t>(kept, 1);
    if (top_k <= 0 || kept < top_k) {
      top_k = static_cast<int32_t>(kept);
      n = numbers;  // the cut below compares with the non-NaN count
    }
  }
  const bool cut_k = top_k > 0 && top_k < n;
  const bool cut_p = top_p < 1.0f;
  if (!cut_k && !cut_p) {
    // NaN logits have weight 0. Eight partial sums in a fixed order: fast and the same on
    // every ISA and thread count.
    double partial[8] = {};
    int64_t i = 0;
    for (; i + 8 <= vocab; i += 8) {
      for (int j = 0; j < 8; ++j) {
        partial[j] += weight[i + j];
      }
    }
    for (; i < vocab; ++i) {
      partial[0] += weight[i];
    }
    double total = 0.0;
    for (double x : partial) {
      total += x;
    }
    // Draw in ascending id order.
    const double target = u * total;
    double cumulative = 0.0;
    int32_t chosen = 0;
    for (int64_t j = 0; j < vocab; ++j) {
      if (row[j] == row[j]) {
        cumulative += weight[j];
        chosen = static_cast<int32_t>(j);
        if (cumulative > target) {
          break;
        }
      }
    }
    return chosen;
  }

  // Histogram of weight buckets, then collect only the buckets the kept set can reach (plus
  // one: the vector exp may round non-monotonically by an ulp across a bucket edge).
  int64_t count[kBuckets] = {};
  float bucket_mass[kBuckets] = {};  // only steers how much to collect
  for (int64_t i = 0; i < vocab; ++i) {
    const int b = Bucket(weight[i]);
    ++count[b];
    bucket_mass[b] += weight[i];
  }
  int limit = 0;
  if (cut_k) {
    for (int64_t c = 0; limit < kBuckets - 1; ++limit) {
      c += count[limit];
      if (c >= top_k) {
        break;
      }
    }
  } else {
    double all = 0.0, m = 0.0;
    for (float x : bucket_mass) {
      all += x;
    }
    for (; limit < kBuckets - 1; ++limit) {
      m += bucket_mass[limit];
      if (m >= static_cast<double>(top_p) * all) {
        break;
      }
    }
  }
  limit = std::min(limit + 1, kBuckets - 1);
  int64_t m = 0;
  for (int64_t i = 0; i < vocab; ++i) {
    if (Bucket(weight[i]) <= limit && row[i] == row[i]) {
      cand[m++] = Candidate{row[i], static_cast<int32_t>(i)};
    }
  }
  // The kept set is a prefix of the rank order among the collected candidates.
  int64_t kept = m;
  if (cut_k) {
    kept = std::min<int64_t>(top_k, m);
    std::nth_element(cand, cand + kept - 1, cand + m, Before);
  }
  if (cut_p) {
    double kept_mass = 0.0;
    if (cut_k) {
      for (int64_t i = 0; i < kept; ++i) {
        kept_mass += weight[cand[i].id];
      }
    } else {
      for (int64_t i = 0; i < vocab; ++i) {
        kept_mass += weight[i];  // NaN logits weigh 0
      }
    }
    // Rank the kept prefix lazily: sort 64 first, then 4x more while the mass falls short.
    const double target = static_cast<double>(top_p) * kept_mass;
    double cumulative = 0.0;
    int64_t sorted = 0;
    int64_t cut = kept;
    bool reached = false;
    while (sorted < kept && !reached) {
      const int64_t next = std::min(kept, std::max<int64_t>(64, 4 * sorted));
      if (next < kept) {
        std::nth_element(cand + sorted, cand + next - 1, cand + kept, Before);
      }
      std::sort(cand + sorted, cand + next, Before);
      for (int64_t i = sorted; i < next; ++i) {
        cumulative += weight[cand[i].id];
        if (cumulative >= target) {
          cut = i + 1;
          reached = true;
          break;
        }
      }
      sorted = next;
    }
    kept = cut;
  }
  // Draw in ascending id order over the kept set cand[0, kept).
  std::sort(cand, cand + kept, [](const Candidate& a, const Candidate& b) { return a.id < b.id; });
  double total = 0.0;
  for (int64_t i = 0; i < kept; ++i) {
    total += weight[cand[i].id];
  }
  const double target = u * total;
  double cumulative = 0.0;
  for (int64_t i = 0; i < kept; ++i) {
    cumulative += weight[cand[i].id];
    if (cumulative > target) {
      return cand[i].id;
    }
  }
  return cand[kept - 1].id;
}

int SamplingSlots(const OpContext& ctx, int64_t num_seqs) {
  return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(NumThreads(ctx), num_seqs)));
}

}  // namespace

int64_t SamplingWorkspaceBytes(const OpContext& ctx, const SamplingParams& p) {
  if (p.temperature == nullptr) {
    return 0;
  }
  return SamplingSlots(ctx, p.num_seqs) * p.vocab_size * kBytesPerCandidate;
}

void Sample(const OpContext& ctx, const SamplingParams& p) {
  const int slots = p.temperature == nullptr ? 1 : SamplingSlots(ctx, p.num_seqs);
  ParallelStrided(ctx, p.num_seqs, slots, [&](int slot, int64_t s) {
    const float* row = p.logits + s * p.logits_stride;
    if (p.temperature == nullptr || IsGreedyTemperature(p.temperature[s])) {
      p.out_tokens[s] = Greedy(row, p.vocab_size);
      return;
    }
    void* scratch = static_cast<char*>(p.workspace) + slot * p.vocab_size * kBytesPerCandidate;
    p.out_tokens[s] =
        SampleRow(row, p.vocab_size, p.temperature[s], p.min_p != nullptr ? p.min_p[s] : 0.0f,
                  p.top_k != nullptr ? p.top_k[s] : 0, p.top_p != nullptr ? p.top_p[s] : 1.0f,
                  SamplingUniform(p.seeds[s], p.steps[s]), scratch);
  });
}

void ApplyTokenMask(const OpContext& ctx, const TokenMaskParams& p) {
  const int slots = static_cast<int>(std::min<int64_t>(p.num_seqs, 64));
  ParallelStrided(ctx, p.num_seqs, slots, [&](int, int64_t s) {
    float* row = p.logits + s * p.logits_stride;
    const uint32_t* words = p.mask + s * p.mask_stride_words;
    const int64_t full = p.vocab_size / 32;
    for (int64_t w = 0; w <= full; ++w) {
      const int64_t base = w * 32;
      const int64_t n = std::min<int64_t>(32, p.vocab_size - base);
      if (n <= 0) break;
      const uint32_t bits = words[w];
      if (bits == 0xffffffffu) continue;
      for (int64_t b = 0; b < n; ++b) {
        if (((bits >> b) & 1u) == 0) row[base + b] = std::numeric_limits<float>::quiet_NaN();
      }
    }
  });
}

}  // namespace pd::kernels::cpu
