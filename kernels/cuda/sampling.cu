// Sampling on CUDA: one thread block per sequence, no workspace. Instead of sorting, the kept
// set of kernels/sampling_params.h is found as a threshold on the rank key (SamplingRankKey:
// keys ascend in rank order), each threshold by a 64-step bitwise search whose every step is one
// block-wide count or mass reduction over the row. Slow for large vocabularies (~130 passes
// over the row when both top-k and top-p cut) but exact in the rule and free of data races.
#include <cmath>
#include <cstdint>

#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/device_utils.cuh"
#include "kernels/cuda/launch_config.h"

namespace pd::kernels::cuda {
namespace {

constexpr int kSamplingWarps = kSamplingThreads / kWarpSize;
constexpr uint64_t kAllKeys = ~uint64_t{0};

// Shared scratch of one sampling block.
struct SampleShared {
  double warp_double[kSamplingWarps];
  unsigned long long warp_u64[kSamplingWarps];
  float warp_float[kSamplingWarps];
  int32_t warp_id[kSamplingWarps];
  double prefix[kSamplingThreads];  // the draw: each thread's segment mass, then prefix sums
};

// Block-wide reductions: every thread returns the same value (each thread sums the warp
// results in the same order, so the result is deterministic). A trailing barrier lets the
// caller reuse the scratch at once.
__device__ double BlockSum(double v, SampleShared& sh) {
  v = WarpReduceSum(v);
  if (threadIdx.x % kWarpSize == 0) {
    sh.warp_double[threadIdx.x / kWarpSize] = v;
  }
  __syncthreads();
  double total = 0.0;
  for (int w = 0; w < kSamplingWarps; ++w) {
    total += sh.warp_double[w];
  }
  __syncthreads();
  return total;
}

__device__ unsigned long long BlockSum(unsigned long long v, SampleShared& sh) {
  v = WarpReduceSum(v);
  if (threadIdx.x % kWarpSize == 0) {
    sh.warp_u64[threadIdx.x / kWarpSize] = v;
  }
  __syncthreads();
  unsigned long long total = 0;
  for (int w = 0; w < kSamplingWarps; ++w) {
    total += sh.warp_u64[w];
  }
  __syncthreads();
  return total;
}

// Best of (value, id) pairs: larger value, then smaller id; (-inf, INT32_MAX) is "none".
__device__ inline bool Better(float v, int32_t id, float best_v, int32_t best_id) {
  return v > best_v || (v == best_v && id < best_id);
}

__device__ void BlockArgMax(float* v, int32_t* id, SampleShared& sh) {
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    const float ov = __shfl_xor_sync(0xffffffffu, *v, offset);
    const int32_t oid = __shfl_xor_sync(0xffffffffu, *id, offset);
    if (Better(ov, oid, *v, *id)) {
      *v = ov;
      *id = oid;
    }
  }
  if (threadIdx.x % kWarpSize == 0) {
    sh.warp_float[threadIdx.x / kWarpSize] = *v;
    sh.warp_id[threadIdx.x / kWarpSize] = *id;
  }
  __syncthreads();
  *v = sh.warp_float[0];
  *id = sh.warp_id[0];
  for (int w = 1; w < kSamplingWarps; ++w) {
    if (Better(sh.warp_float[w], sh.warp_id[w], *v, *id)) {
      *v = sh.warp_float[w];
      *id = sh.warp_id[w];
    }
  }
  __syncthreads();
}

__device__ float BlockMax(float v, SampleShared& sh) {
  int32_t unused = 0;
  BlockArgMax(&v, &unused, sh);
  return v;
}

// The unnormalised probability of a non-NaN logit (the row maximum weighs 1).
__device__ inline float Weight(float logit, float max_logit, float inv_temperature) {
  if (isinf(max_logit)) {  // +inf logits share all mass; all -inf: uniform
    return logit == max_logit ? 1.0f : 0.0f;
  }
  return expf((logit - max_logit) * inv_temperature);
}

__global__ void SampleKernel(SamplingParams p) {
  __shared__ SampleShared sh;
  const int64_t s = blockIdx.x;
  const float* row = p.logits + s * p.logits_stride;
  const int64_t vocab = p.vocab_size;
  const int64_t tid = threadIdx.x;

  float max_logit = -INFINITY;
  unsigned long long count = 0;
  for (int64_t i = tid; i < vocab; i += blockDim.x) {
    const float v = row[i];
    if (v == v) {
      ++count;
      max_logit = fmaxf(max_logit, v);
    }
  }
  max_logit = BlockMax(max_logit, sh);
  const int64_t n = static_cast<int64_t>(BlockSum(count, sh));
  if (n == 0) {  // all NaN (uniform across the block, so everyone leaves together)
    if (tid == 0) {
      p.out_tokens[s] = 0;
    }
    return;
  }
  const float temperature = p.temperature != nullptr ? p.temperature[s] : 0.0f;
  if (!(temperature > 0.0f)) {
    // Greedy: the maximum, ties to the lowest id.
    float best = -INFINITY;
    int32_t best_id = INT32_MAX;
    for (int64_t i = tid; i < vocab; i += blockDim.x) {
      const float v = row[i];
      if (v == v && Better(v, static_cast<int32_t>(i), best, best_id)) {
        best = v;
        best_id = static_cast<int32_t>(i);
      }
    }
    BlockArgMax(&best, &best_id, sh);
    if (tid == 0) {
      p.out_tokens[s] = best_id;  // a non-NaN exists, so best_id < vocab
    }
    return;
  }
  const float inv_t = 1.0f / temperature;
  const int32_t top_k = p.top_k != nullptr ? p.top_k[s] : 0;
  const float top_p = p.top_p != nullptr ? p.top_p[s] : 1.0f;

  // Top-k: the k-th smallest key (keys are unique: the id is in the low bits).
  uint64_t kept_max = kAllKeys;
  if (top_k > 0 && top_k < n) {
    kept_max = SmallestKey([&](uint64_t key) {
      unsigned long long c = 0;
      for (int64_t i = tid; i < vocab; i += blockDim.x) {
        const float v = row[i];
        c += (v == v && SamplingRankKey(v, static_cast<int32_t>(i)) <= key) ? 1 : 0;
      }
      return BlockSum(c, sh) >= static_cast<unsigned long long>(top_k);
    });
  }
  // Mass of the candidates with key <= limit.
  auto mass_upto = [&](uint64_t limit) {
    double m = 0.0;
    for (int64_t i = tid; i < vocab; i += blockDim.x) {
      const float v = row[i];
      if (v == v && SamplingRankKey(v, static_cast<int32_t>(i)) <= limit) {
        m += Weight(v, max_logit, inv_t);
      }
    }
    return BlockSum(m, sh);
  };
  // Top-p: the shortest rank prefix of the top-k set whose mass reaches top_p of its mass. Sums
  // over growing key sets are monotone (non-negative terms, fixed order), and at kept_max the
  // sum is exactly kept_mass, so the search never passes kept_max.
  if (top_p < 1.0f) {
    const double kept_mass = mass_upto(kept_max);
    const double target = static_cast<double>(top_p) * kept_mass;
    const uint64_t cut = SmallestKey(
        [&](uint64_t key) { return mass_upto(key < kept_max ? key : kept_max) >= target; });
    kept_max = cut < kept_max ? cut : kept_max;
  }

  // The draw, in ascending id order: thread t walks ids [begin, end) after the mass of all
  // lower segments.
  const Segment seg = SegmentOf(tid, vocab, blockDim.x);
  double local = 0.0;
  for (int64_t i = seg.begin; i < seg.end; ++i) {
    const float v = row[i];
    if (v == v && SamplingRankKey(v, static_cast<int32_t>(i)) <= kept_max) {
      local += Weight(v, max_logit, inv_t);
    }
  }
  sh.prefix[tid] = local;
  __syncthreads();
  if (tid == 0) {
    double running = 0.0;
    for (int t = 0; t < static_cast<int>(blockDim.x); ++t) {
      const double m = sh.prefix[t];
      sh.prefix[t] = running;  // exclusive prefix
      running += m;
    }
    sh.warp_double[0] = running;  // the kept mass
  }
  __syncthreads();
  const double target = SamplingUniform(p.seeds[s], p.steps[s]) * sh.warp_double[0];
  double cumulative = sh.prefix[tid];
  int32_t chosen = INT32_MAX;  // first id whose cumulative mass exceeds the target
  int32_t last_kept = -1;      // fallback when rounding leaves the target unreached
  for (int64_t i = seg.begin; i < seg.end; ++i) {
    const float v = row[i];
    if (v == v && SamplingRankKey(v, static_cast<int32_t>(i)) <= kept_max) {
      last_kept = static_cast<int32_t>(i);
      cumulative += Weight(v, max_logit, inv_t);
      if (cumulative > target) {
        chosen = static_cast<int32_t>(i);
        break;
      }
    }
  }
  __syncthreads();  // everyone has read sh.warp_double[0] before BlockArgMax reuses the scratch
  // Lowest chosen id: equal values tie to the lowest id.
  float neg = chosen == INT32_MAX ? -INFINITY : 0.0f;
  int32_t first = chosen;
  BlockArgMax(&neg, &first, sh);
  // Highest kept id: the lowest of -id among threads that kept any.
  float any = last_kept >= 0 ? 0.0f : -INFINITY;
  int32_t neg_last = last_kept >= 0 ? -last_kept : INT32_MAX;
  BlockArgMax(&any, &neg_last, sh);
  if (tid == 0) {
    p.out_tokens[s] = first != INT32_MAX ? first : -neg_last;
  }
}

}  // namespace

cudaError_t LaunchSample(const SamplingParams& p, cudaStream_t stream) {
  const LaunchShape s = SamplingLaunch(p.num_seqs);
  if (s.grid > kMaxGridX) {
    return cudaErrorInvalidConfiguration;
  }
  SampleKernel<<<static_cast<unsigned>(s.grid), s.threads, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace pd::kernels::cuda
