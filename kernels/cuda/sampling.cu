// Sampling on CUDA: one block of kSamplingThreads threads per sequence, no workspace. The
// algorithm is kernels/cuda/sampling_radix.h's SampleRowRadix (a radix select over the rank keys
// with fixed-point masses), instantiated here with BlockRow, whose primitives are block-wide
// passes over the logits row. Every sum is an integer sum, so the result does not depend on the
// order in which threads add (atomics included): the same row gives the same token every time.
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/device_utils.cuh"
#include "kernels/cuda/launch_config.h"
#include "kernels/cuda/sampling_radix.h"

namespace pd::kernels::cuda {
namespace {

// Shared scratch of one sampling block.
struct SampleShared {
  unsigned long long warp_u64[kSamplingWarps];
  float warp_float[kSamplingWarps];
  int32_t warp_id[kSamplingWarps];
  uint32_t counts[kRadixBins];
  unsigned long long masses[kRadixBins];
  int pick_bin;  // Pick's result (plain fields: shared variables take no initialisers)
  unsigned long long pick_below_count;
  unsigned long long pick_below_mass;
  int32_t drawn;
};

static_assert(kSamplingWarps == kWarpSize, "the block reductions give lane l warp l's result");

// Block-wide sum: every thread returns the same value. The second stage is a warp butterfly in
// every warp (lane l takes warp l's total), not a serial loop over the warps' totals. With
// that loop (CUDA 13.0, sm_90) the argmax below lost the results of warps 26 and 27 on an
// H200, reproducibly and with racecheck clean; the PTX was right, the cause was not found.
// The butterfly form passes (CudaSamplingTest.GreedyFindsTheMaximumAnywhereInALongRow). A
// trailing barrier lets the caller reuse the scratch at once.
__device__ unsigned long long BlockSum(unsigned long long v, SampleShared& sh) {
  v = WarpReduceSum(v);
  if (threadIdx.x % kWarpSize == 0) {
    sh.warp_u64[threadIdx.x / kWarpSize] = v;
  }
  __syncthreads();
  const unsigned long long total = WarpReduceSum(sh.warp_u64[threadIdx.x % kWarpSize]);
  __syncthreads();
  return total;
}

// Best of (value, id) pairs: larger value, then smaller id; (-inf, INT32_MAX) is "none".
__device__ inline bool Better(float v, int32_t id, float best_v, int32_t best_id) {
  return v > best_v || (v == best_v && id < best_id);
}

// Butterfly argmax over a warp's lanes: every lane ends with the best pair.
__device__ inline void WarpArgMax(float* v, int32_t* id) {
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    const float ov = __shfl_xor_sync(0xffffffffu, *v, offset);
    const int32_t oid = __shfl_xor_sync(0xffffffffu, *id, offset);
    if (Better(ov, oid, *v, *id)) {
      *v = ov;
      *id = oid;
    }
  }
}

// Block-wide argmax: each warp's best goes to shared memory, then every warp reduces the 32
// of them with the same butterfly (BlockSum says why not a loop). Every thread returns the
// block's best.
__device__ void BlockArgMax(float* v, int32_t* id, SampleShared& sh) {
  WarpArgMax(v, id);
  if (threadIdx.x % kWarpSize == 0) {
    sh.warp_float[threadIdx.x / kWarpSize] = *v;
    sh.warp_id[threadIdx.x / kWarpSize] = *id;
  }
  __syncthreads();
  *v = sh.warp_float[threadIdx.x % kWarpSize];
  *id = sh.warp_id[threadIdx.x % kWarpSize];
  WarpArgMax(v, id);
  __syncthreads();
}

// Inclusive prefix sum over a warp's lanes.
__device__ inline unsigned long long WarpInclusiveScan(unsigned long long v) {
  const int lane = threadIdx.x % kWarpSize;
  for (int offset = 1; offset < kWarpSize; offset *= 2) {
    const unsigned long long o = __shfl_up_sync(0xffffffffu, v, offset);
    if (lane >= offset) {
      v += o;
    }
  }
  return v;
}

// The primitives of SampleRowRadix over one row, for all threads of the block.
class BlockRow {
 public:
  __device__ BlockRow(const float* row, int64_t vocab, SampleShared& sh)
      : row_(row), vocab_(vocab), sh_(sh) {}

  __device__ RowSummary Summarize() {
    float best = -INFINITY;
    int32_t best_id = INT32_MAX;
    unsigned long long count = 0;
    for (int64_t i = threadIdx.x; i < vocab_; i += blockDim.x) {
      const float v = row_[i];
      if (v == v) {
        ++count;
        if (Better(v, static_cast<int32_t>(i), best, best_id)) {
          best = v;
          best_id = static_cast<int32_t>(i);
        }
      }
    }
    BlockArgMax(&best, &best_id, sh_);
    RowSummary s;
    s.count = static_cast<int64_t>(BlockSum(count, sh_));
    s.max = best;
    s.argmax = s.count > 0 ? best_id : 0;
    return s;
  }

  __device__ void SetWeights(float max_logit, float inv_t) {
    max_ = max_logit;
    inv_t_ = inv_t;
  }

  __device__ int64_t CountAtLeast(float min_p) {
    unsigned long long count = 0;
    for (int64_t i = threadIdx.x; i < vocab_; i += blockDim.x) {
      const float v = row_[i];
      if (v == v && MinPKeeps(v, max_, inv_t_, min_p)) {
        ++count;
      }
    }
    return static_cast<int64_t>(BlockSum(count, sh_));
  }

  __device__ void Histogram(RadixState s, int shift, uint64_t limit) {
    // Every thread has read the previous pass's bins (SampleRowRadix reads counts() after
    // Pick) before they are cleared: without it a fast warp cleared them under a slow one
    // (compute-sanitizer racecheck on an H200).
    __syncthreads();
    for (int b = threadIdx.x; b < kRadixBins; b += blockDim.x) {
      sh_.counts[b] = 0;
      sh_.masses[b] = 0;
    }
    __syncthreads();
    for (int64_t i = threadIdx.x; i < vocab_; i += blockDim.x) {
      const float v = row_[i];
      if (v != v) {
        continue;
      }
      const uint64_t key = SamplingRankKey(v, static_cast<int32_t>(i));
      if (key > limit || !RadixOpen(key, s)) {
        continue;
      }
      const uint64_t w = FixedWeight(v, max_, inv_t_);
      if (w == 0) {
        continue;
      }
      const int d = RadixDigit(key, shift);
      atomicAdd(&sh_.counts[d], 1u);
      atomicAdd(&sh_.masses[d], static_cast<unsigned long long>(w));
    }
    __syncthreads();
  }

  __device__ const uint32_t* counts() const { return sh_.counts; }
  __device__ const uint64_t* masses() const {
    return reinterpret_cast<const uint64_t*>(sh_.masses);
  }

  // Warp 0 finds the bin: lane l holds bins [8 l, 8 l + 8), the lanes' totals are scanned, and
  // the first lane whose inclusive total reaches `need` picks within its own bins.
  __device__ RadixPick Pick(bool by_mass, uint64_t need) {
    constexpr int kPerLane = kRadixBins / kWarpSize;
    if (threadIdx.x < kWarpSize) {
      const int lane = threadIdx.x;
      const uint32_t* c = sh_.counts + lane * kPerLane;
      const uint64_t* m = masses() + lane * kPerLane;
      unsigned long long lane_count = 0, lane_mass = 0;
      for (int j = 0; j < kPerLane; ++j) {
        lane_count += c[j];
        lane_mass += m[j];
      }
      const unsigned long long incl_count = WarpInclusiveScan(lane_count);
      const unsigned long long incl_mass = WarpInclusiveScan(lane_mass);
      const unsigned long long incl = by_mass ? incl_mass : incl_count;
      const unsigned reached = __ballot_sync(0xffffffffu, incl >= need);
      const int first = reached != 0 ? __ffs(static_cast<int>(reached)) - 1 : kWarpSize - 1;
      if (lane == first) {
        const uint64_t below_count = incl_count - lane_count;
        const uint64_t below_mass = incl_mass - lane_mass;
        RadixPick p = PickBin(c, m, kPerLane, by_mass, need - (by_mass ? below_mass : below_count));
        p.bin += lane * kPerLane;
        p.below_count += below_count;
        p.below_mass += below_mass;
        sh_.pick_bin = p.bin;
        sh_.pick_below_count = p.below_count;
        sh_.pick_below_mass = p.below_mass;
      }
    }
    __syncthreads();
    RadixPick p;
    p.bin = sh_.pick_bin;
    p.below_count = sh_.pick_below_count;
    p.below_mass = sh_.pick_below_mass;
    __syncthreads();
    return p;
  }

  // Warp w sums its chunk (DrawChunkOf); every thread scans the 32 warp totals; the warp whose
  // chunk holds the crossing walks it 32 ids at a time with a warp scan and a ballot.
  __device__ int32_t Draw(uint64_t limit, double u) {
    const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
    const Segment chunk = DrawChunkOf(warp, vocab_, kSamplingWarps);
    unsigned long long local = 0;
    for (int64_t i = chunk.begin + lane; i < chunk.end; i += kWarpSize) {
      local += Weight(i, limit);
    }
    local = WarpReduceSum(local);
    if (lane == 0) {
      sh_.warp_u64[warp] = local;
    }
    __syncthreads();
    // Lane l of every warp takes warp l's total; a warp scan gives the total and what the
    // warps before this one hold (BlockSum says why not a loop).
    const unsigned long long lane_total = sh_.warp_u64[lane];
    const unsigned long long incl = WarpInclusiveScan(lane_total);
    const unsigned long long total = __shfl_sync(0xffffffffu, incl, kWarpSize - 1);
    const unsigned long long before = __shfl_sync(0xffffffffu, incl - lane_total, warp);
    const uint64_t need = DrawNeed(u, total);
    const bool mine = before < need && before + sh_.warp_u64[warp] >= need;
    if (mine) {  // exactly one warp; its lanes agree
      unsigned long long base = before;
      for (int64_t first = chunk.begin; first < chunk.end; first += kWarpSize) {
        const int64_t i = first + lane;
        const unsigned long long w = i < chunk.end ? Weight(i, limit) : 0;
        const unsigned long long incl = base + WarpInclusiveScan(w);
        const unsigned reached = __ballot_sync(0xffffffffu, incl >= need);
        if (reached != 0) {
          if (lane == __ffs(static_cast<int>(reached)) - 1) {
            sh_.drawn = static_cast<int32_t>(i);
          }
          break;
        }
        base = __shfl_sync(0xffffffffu, incl, kWarpSize - 1);
      }
    }
    __syncthreads();
    return sh_.drawn;
  }

 private:
  // The candidate weight of id i: 0 unless non-NaN with key <= limit.
  __device__ uint64_t Weight(int64_t i, uint64_t limit) const {
    const float v = row_[i];
    if (v != v || SamplingRankKey(v, static_cast<int32_t>(i)) > limit) {
      return 0;
    }
    return FixedWeight(v, max_, inv_t_);
  }

  const float* row_;
  int64_t vocab_;
  SampleShared& sh_;
  float max_ = 0.0f;
  float inv_t_ = 1.0f;
};

__global__ void __launch_bounds__(kSamplingThreads) SampleKernel(SamplingParams p) {
  __shared__ SampleShared sh;
  const int64_t s = blockIdx.x;
  BlockRow row(p.logits + s * p.logits_stride, p.vocab_size, sh);
  const float temperature = p.temperature != nullptr ? p.temperature[s] : 0.0f;
  const bool sample = !IsGreedyTemperature(temperature);
  const int32_t top_k = sample && p.top_k != nullptr ? p.top_k[s] : 0;
  const float top_p = sample && p.top_p != nullptr ? p.top_p[s] : 1.0f;
  const float min_p = sample && p.min_p != nullptr ? p.min_p[s] : 0.0f;
  const double u = sample ? SamplingUniform(p.seeds[s], p.steps[s]) : 0.0;
  const int32_t token = SampleRowRadix(row, temperature, min_p, top_k, top_p, u);
  if (threadIdx.x == 0) {
    p.out_tokens[s] = token;
  }
}

}  // namespace

namespace {

__global__ void ApplyTokenMaskKernel(TokenMaskParams p) {
  const int64_t s = blockIdx.y;
  for (int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; t < p.vocab_size;
       t += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const uint32_t bits = p.mask[s * p.mask_stride_words + (t >> 5)];
    if (((bits >> (t & 31)) & 1u) == 0)
      p.logits[s * p.logits_stride + t] = __int_as_float(0x7fc00000);
  }
}

// One thread per edit: the rule of kernels/sampling_params.h's LogitEdit, each step rounded to
// nearest with the _rn intrinsics, which nvcc never contracts into an FMA (the reference rounds
// after the division and after each subtraction).
__global__ void ApplyLogitEditsKernel(LogitEditParams p) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < p.num_edits;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const LogitEdit e = p.edits[i];
    float* logit = p.logits + p.rows[i] * p.logits_stride + e.token;
    float x = __fadd_rn(*logit, e.bias);
    x = x > 0.0f ? __fdiv_rn(x, e.repetition) : __fmul_rn(x, e.repetition);
    x = __fsub_rn(x, e.frequency);
    x = __fsub_rn(x, e.presence);
    *logit = x;
  }
}

}  // namespace

cudaError_t LaunchApplyLogitEdits(const LogitEditParams& p, cudaStream_t stream) {
  if (p.num_edits <= 0) {
    return cudaSuccess;
  }
  constexpr int kThreads = 256;
  const int64_t blocks = std::min<int64_t>((p.num_edits + kThreads - 1) / kThreads, 4096);
  ApplyLogitEditsKernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

cudaError_t LaunchApplyTokenMask(const TokenMaskParams& p, cudaStream_t stream) {
  constexpr int kThreads = 256;
  const int64_t blocks = std::min<int64_t>((p.vocab_size + kThreads - 1) / kThreads, 1024);
  if (p.num_seqs > 65535) {
    return cudaErrorInvalidConfiguration;
  }
  ApplyTokenMaskKernel<<<dim3(static_cast<unsigned>(blocks), static_cast<unsigned>(p.num_seqs)),
                         kThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

cudaError_t LaunchSample(const SamplingParams& p, cudaStream_t stream) {
  const LaunchShape s = SamplingLaunch(p.num_seqs);
  if (s.grid > kMaxGridX || p.vocab_size >= kMaxSamplingVocab) {
    return cudaErrorInvalidConfiguration;
  }
  SampleKernel<<<static_cast<unsigned>(s.grid), s.threads, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace pd::kernels::cuda
