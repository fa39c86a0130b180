// The CUDA sampler's algorithm (kernels/cuda/sampling.cu), written once for host and device: a
// radix select over the rank keys with integer (fixed-point) masses. The kernel instantiates
// SampleRowRadix with a Row whose primitives are block-wide passes over the logits row;
// kernels/cuda/launch_config_test.cc instantiates it with a serial Row and compares the tokens
// with kernels/reference on the CPU, so the control flow the GPU runs is checked on every CI run.
//
// The rule is kernels/sampling_params.h's, with each candidate's weight exp((logit - max) / T)
// held as a 36-bit fixed-point integer (FixedWeight). Integer sums are exact and independent of
// the order of addition, so every pass is deterministic however the threads are scheduled, and
// the draw's cumulative sums have no rounding at all. The one departure from the reference: a
// candidate whose weight rounds to 0 (below 2^-37 of the maximum's, i.e. logit more than
// 25.6 * T below the row's maximum) is never kept: its probability is below 2^-37 times the
// maximum's, so it is drawn with probability below vocab_size * 2^-37 (1e-6 for a 128k
// vocabulary) by the reference; here never.
//
// Passes over the row (each reads it once; the row stays in L2): 1 for the maximum (and the
// whole answer when greedy); min-p: 1 (a count, which becomes a top-k cut); top-k: at most 8,
// usually 4-5 (one per byte of the 64-bit key until the cut's byte-prefix holds exactly the
// remaining count); top-p likewise; the draw: 1 plus a walk of one warp's share.
//
// Header-only, no CUDA headers (PD_HOST_DEVICE from kernels/half.h).
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/cuda/launch_config.h"
#include "kernels/sampling_params.h"  // IsGreedyTemperature

namespace pd::kernels::cuda {

inline constexpr int kRadixBits = 8;
inline constexpr int kRadixBins = 1 << kRadixBits;
inline constexpr int kRadixPasses = 64 / kRadixBits;
// One in fixed point: 2^36, so a sum over fewer than 2^27 ids cannot overflow 64 bits.
inline constexpr float kFixedWeightOne = 68719476736.0f;
// The sampler accepts vocabularies below this (dispatch checks): the fixed-point sums fit.
inline constexpr int64_t kMaxSamplingVocab = int64_t{1} << 27;

// Weight of a non-NaN logit: exp((logit - max) * inv_t) in float. When the maximum is +-inf
// the +inf logits (or, all -inf, every logit) weigh 1 and the others 0, as in the reference.
PD_HOST_DEVICE inline float RadixWeight(float logit, float max_logit, float inv_t) {
  if (max_logit == INFINITY || max_logit == -INFINITY) {
    return logit == max_logit ? 1.0f : 0.0f;
  }
  return expf((logit - max_logit) * inv_t);
}

// The weight in fixed point: round(RadixWeight * 2^36). The multiply by 2^36 is exact, so the
// only rounding is rintf's.
PD_HOST_DEVICE inline uint64_t FixedWeight(float logit, float max_logit, float inv_t) {
  return static_cast<uint64_t>(rintf(RadixWeight(logit, max_logit, inv_t) * kFixedWeightOne));
}

// min-p's rule for a non-NaN logit: kept when its weight (before the fixed-point rounding) is at
// least min_p.
PD_HOST_DEVICE inline bool MinPKeeps(float logit, float max_logit, float inv_t, float min_p) {
  return RadixWeight(logit, max_logit, inv_t) >= min_p;
}

// A byte-prefix of the rank key fixed so far: keys k with (k & mask) == prefix are still open.
struct RadixState {
  uint64_t prefix = 0;
  uint64_t mask = 0;
};

// Shift of pass `pass`'s digit (the most significant byte first).
PD_HOST_DEVICE constexpr int RadixShift(int pass) { return 64 - kRadixBits * (pass + 1); }

PD_HOST_DEVICE constexpr int RadixDigit(uint64_t key, int shift) {
  return static_cast<int>((key >> shift) & (kRadixBins - 1));
}

PD_HOST_DEVICE constexpr bool RadixOpen(uint64_t key, RadixState s) {
  return (key & s.mask) == s.prefix;
}

// The state after choosing `bin` at `shift`.
PD_HOST_DEVICE constexpr RadixState RadixDescend(RadixState s, int bin, int shift) {
  return {s.prefix | (static_cast<uint64_t>(bin) << shift),
          s.mask | (static_cast<uint64_t>(kRadixBins - 1) << shift)};
}

// The largest key with the state's prefix: "keys <= RadixLimit(s)" is every key below the
// prefix plus every open key.
PD_HOST_DEVICE constexpr uint64_t RadixLimit(RadixState s) { return s.prefix | ~s.mask; }

// The bin holding the need-th unit (count or mass) of a histogram: the first bin b whose
// cumulative value through b reaches need (need >= 1 and at most the histogram's total);
// below = the cumulative value before b, of counts and of masses.
struct RadixPick {
  int bin = 0;
  uint64_t below_count = 0;
  uint64_t below_mass = 0;
};

// Serial pick over bins [0, n) (the device splits the 256 bins over a warp's lanes and lets the
// lane holding the crossing run this over its own bins).
PD_HOST_DEVICE inline RadixPick PickBin(const uint32_t* counts, const uint64_t* masses, int n,
                                        bool by_mass, uint64_t need) {
  RadixPick p;
  for (int b = 0; b < n; ++b) {
    const uint64_t v = by_mass ? masses[b] : counts[b];
    const uint64_t have = by_mass ? p.below_mass : p.below_count;
    if (have + v >= need) {
      p.bin = b;
      return p;
    }
    p.below_count += counts[b];
    p.below_mass += masses[b];
  }
  p.bin = n - 1;  // unreachable when need <= the total
  return p;
}

// The draw's target: the kept id whose cumulative mass (ascending ids) first reaches
// floor(u * total) + 1, i.e. first EXCEEDS u * total (u in [0, 1)), clamped to [1, total].
PD_HOST_DEVICE inline uint64_t DrawNeed(double u, uint64_t total) {
  const double t = u * static_cast<double>(total);
  uint64_t need = t >= static_cast<double>(total) ? total : static_cast<uint64_t>(t) + 1;
  return need < 1 ? 1 : (need > total ? total : need);
}

// Top-p's target: the smallest rank prefix whose mass reaches top_p * total, i.e. mass >=
// ceil(top_p * total), clamped to [1, total].
PD_HOST_DEVICE inline uint64_t TopPNeed(float top_p, uint64_t total) {
  const double t = static_cast<double>(top_p) * static_cast<double>(total);
  uint64_t need = t >= static_cast<double>(total) ? total : static_cast<uint64_t>(ceil(t));
  return need < 1 ? 1 : (need > total ? total : need);
}

// Summary of a row's non-NaN logits: the maximum, its lowest id, and how many there are.
struct RowSummary {
  float max = -INFINITY;
  int32_t argmax = 0;
  int64_t count = 0;
};

// Row: the primitives, each a pass over one logits row, each returning the same value to every
// caller (every thread of a block on the device):
//   RowSummary Summarize();
//   void SetWeights(float max_logit, float inv_t);  // for the passes below
//   // How many non-NaN logits MinPKeeps (min_p in (0, 1]).
//   int64_t CountAtLeast(float min_p);
//   // Over the candidates (non-NaN, FixedWeight > 0, key <= limit, RadixOpen(key, s)), per
//   // digit at `shift`: how many and their mass. Histogram arrays belong to the Row.
//   void Histogram(RadixState s, int shift, uint64_t limit);
//   const uint32_t* counts(); const uint64_t* masses();
//   RadixPick Pick(bool by_mass, uint64_t need);  // over the last histogram
//   // The lowest id (ascending) at which the cumulative mass of candidates with key <= limit
//   // reaches DrawNeed(u, their total mass).
//   int32_t Draw(uint64_t limit, double u);
#ifdef __CUDACC__
#pragma nv_exec_check_disable
#endif
template <typename Row>
PD_HOST_DEVICE int32_t SampleRowRadix(Row& row, float temperature, float min_p, int32_t top_k,
                                      float top_p, double u) {
  const RowSummary sum = row.Summarize();
  if (sum.count == 0) {
    return 0;  // all NaN
  }
  if (IsGreedyTemperature(temperature)) {
    return sum.argmax;  // greedy: below kMinSamplingTemperature, or NaN
  }
  row.SetWeights(sum.max, 1.0f / temperature);
  if (min_p > 0.0f) {
    // The tokens min-p keeps are a prefix of the rank order (the weight grows with the logit):
    // a top-k cut with k = their number, at least 1 (the maximum weighs 1).
    const int64_t kept = row.CountAtLeast(min_p);
    const int32_t k = static_cast<int32_t>(kept < 1 ? 1 : kept);
    if (top_k <= 0 || k < top_k) {
      top_k = k;
    }
  }
  uint64_t limit = ~uint64_t{0};  // candidates are the keys <= limit
  if (top_k > 0) {
    RadixState s;
    uint64_t need = static_cast<uint64_t>(top_k);
    for (int pass = 0; pass < kRadixPasses; ++pass) {
      const int shift = RadixShift(pass);
      row.Histogram(s, shift, limit);
      if (pass == 0) {
        uint64_t candidates = 0;
        for (int b = 0; b < kRadixBins; ++b) {
          candidates += row.counts()[b];
        }
        if (candidates <= need) {
          break;  // top-k keeps every candidate
        }
      }
      const RadixPick pick = row.Pick(/*by_mass=*/false, need);
      need -= pick.below_count;
      s = RadixDescend(s, pick.bin, shift);
      if (row.counts()[pick.bin] == need) {  // the whole bin is kept: the cut is its last key
        limit = RadixLimit(s);
        break;
      }
    }
  }
  if (top_p < 1.0f) {
    RadixState s;
    uint64_t need = 0;
    for (int pass = 0; pass < kRadixPasses; ++pass) {
      const int shift = RadixShift(pass);
      row.Histogram(s, shift, limit);
      if (pass == 0) {
        uint64_t total = 0;
        for (int b = 0; b < kRadixBins; ++b) {
          total += row.masses()[b];
        }
        need = TopPNeed(top_p, total);
      }
      const RadixPick pick = row.Pick(/*by_mass=*/true, need);
      need -= pick.below_mass;
      s = RadixDescend(s, pick.bin, shift);
      // One key left in the bin: it is where the mass first reaches the target. (More than one:
      // the crossing may lie before the bin's last key, so descend.)
      if (row.counts()[pick.bin] == 1) {
        const uint64_t cut = RadixLimit(s);
        limit = cut < limit ? cut : limit;
        break;
      }
    }
  }
  return row.Draw(limit, u);
}

}  // namespace pd::kernels::cuda
