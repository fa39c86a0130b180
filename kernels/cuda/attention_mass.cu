// The H2O and SnapKV KV policies on CUDA. AttentionMass (their score pass): MassStatsKernel
// reduces each query row's softmax max and sum, MassAddKernel adds every key's weights in the
// params' order, one thread per key (kernels/cuda/launch_config.h, "AttentionMass", has the
// math and says what is bitwise the CPU's and what is not). GatherKvRows (their compaction):
// one block per kept row, bytes as stored. Not yet run on a GPU.
#include <cmath>

#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/device_utils.cuh"
#include "kernels/cuda/launch_config.h"

namespace pd::kernels::cuda {
namespace {

constexpr int kMassWarps = kMassThreads / kWarpSize;

// grid = num_tokens * num_heads: block b is query j = b / num_heads, head h = b % num_heads.
__global__ void __launch_bounds__(kMassThreads)
    MassStatsKernel(AttentionMassParams p, KvCacheView c) {
  __shared__ float warp_value[kMassWarps];
  __shared__ float row_max;
  const int64_t j = blockIdx.x / p.num_heads;
  const int64_t h = blockIdx.x % p.num_heads;
  const int64_t g = h / (p.num_heads / p.num_kv_heads);
  const int64_t keys = p.start_pos + j + 1;
  const float scale = MassScale(p);
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  float max = -INFINITY;
  for (int64_t t = threadIdx.x; t < keys; t += kMassThreads) {
    max = fmaxf(max, MassScore(p, c, j, h, t, g, scale));
  }
  max = WarpReduceMax(max);
  if (lane == 0) warp_value[warp] = max;
  __syncthreads();
  if (threadIdx.x == 0) {
    float m = -INFINITY;
    for (int w = 0; w < kMassWarps; ++w) m = fmaxf(m, warp_value[w]);
    row_max = m;
  }
  __syncthreads();
  const float m = row_max;
  float sum = 0.0f;
  for (int64_t t = threadIdx.x; t < keys; t += kMassThreads) {
    sum += expf(MassScore(p, c, j, h, t, g, scale) - m);
  }
  sum = WarpReduceSum(sum);
  __syncthreads();  // every thread has read row_max's warp values
  if (lane == 0) warp_value[warp] = sum;
  __syncthreads();
  if (threadIdx.x == 0) {
    float s = 0.0f;
    for (int w = 0; w < kMassWarps; ++w) s += warp_value[w];
    p.workspace[blockIdx.x * 2] = m;
    p.workspace[blockIdx.x * 2 + 1] = s;
  }
}

// grid = (num_kv_heads, MassKeyTiles(start_pos + num_tokens)): thread i of block (g, b) owns
// slot b * kMassThreads + i of kv head g.
__global__ void __launch_bounds__(kMassThreads)
    MassAddKernel(AttentionMassParams p, KvCacheView c) {
  const int64_t g = blockIdx.x;
  const int64_t t = static_cast<int64_t>(blockIdx.y) * kMassThreads + threadIdx.x;
  if (t >= p.start_pos + p.num_tokens) return;
  float* mass = p.mass + g * p.mass_head_stride + t;
  *mass = MassOfSlot(p, c, p.workspace, g, t, *mass);
}

// grid = (num_keep, num_kv_heads, num_layers): block (i, g, l) copies kept row i of kv head g,
// layer l, K and V (and a quantized row's scales), bytes as stored.
__global__ void GatherKvRowsKernel(GatherKvRowsParams p) {
  const KvCacheView& c = p.cache;
  const int64_t i = blockIdx.x, g = blockIdx.y, layer = blockIdx.z;
  const int64_t s = p.keep[(layer * p.keep_heads + p.keep_first_head + g) * p.num_keep + i];
  const int64_t from = p.src_blocks[s / c.block_size], to = p.dst_blocks[i / c.block_size];
  const int64_t row = KvRowBytes(c);
  const int64_t scales = IsQuantizedKvDType(c.dtype) ? 4 * KvScalesPerRow(c.dtype, c.head_dim) : 0;
  auto* base = static_cast<uint8_t*>(c.base);
  for (int v = 0; v < 2; ++v) {
    const uint8_t* src = base + KvRowByteOffset(c, from, layer, v, g, s % c.block_size);
    uint8_t* dst = base + KvRowByteOffset(c, to, layer, v, g, i % c.block_size);
    for (int64_t b = threadIdx.x; b < row; b += blockDim.x) dst[b] = src[b];
    if (scales > 0) {
      const uint8_t* ss = base + KvRowScalesByteOffset(c, from, layer, v, g, s % c.block_size);
      uint8_t* ds = base + KvRowScalesByteOffset(c, to, layer, v, g, i % c.block_size);
      for (int64_t b = threadIdx.x; b < scales; b += blockDim.x) ds[b] = ss[b];
    }
  }
}

}  // namespace

cudaError_t LaunchGatherKvRows(const GatherKvRowsParams& p, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(p.num_keep), static_cast<unsigned>(p.cache.num_kv_heads),
                  static_cast<unsigned>(p.num_layers));
  GatherKvRowsKernel<<<grid, 128, 0, stream>>>(p);
  return cudaGetLastError();
}

cudaError_t LaunchAttentionMass(const AttentionMassParams& p, cudaStream_t stream) {
  const KvCacheView c = p.cache != nullptr ? *p.cache : KvCacheView{};
  MassStatsKernel<<<static_cast<unsigned>(p.num_tokens * p.num_heads), kMassThreads, 0, stream>>>(
      p, c);
  const dim3 grid(static_cast<unsigned>(p.num_kv_heads),
                  static_cast<unsigned>(MassKeyTiles(p.start_pos + p.num_tokens)));
  MassAddKernel<<<grid, kMassThreads, 0, stream>>>(p, c);
  return cudaGetLastError();
}

}  // namespace pd::kernels::cuda
