// CopyBlocks on CUDA: one thread block per kCopySegmentBytes segment of one copied block, with
// the widest access (16/8/4/2/1 bytes) the addresses and sizes allow, chosen at launch.
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/launch_config.h"

namespace pd::kernels::cuda {
namespace {

template <typename Word>
__device__ void CopyWords(const char* src, char* dst, int64_t bytes) {
  const auto* s = reinterpret_cast<const Word*>(src);
  auto* d = reinterpret_cast<Word*>(dst);
  const int64_t n = bytes / static_cast<int64_t>(sizeof(Word));
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    d[i] = s[i];
  }
}

// grid = num_copies * segments_per_block (CopyBlocksLaunch); block b copies segment
// CopySegmentAt(b) of copy b / segments_per_block.
__global__ void CopyBlocksKernel(CopyBlocksParams p, int64_t segments_per_block, int access_bytes) {
  const CopySegment seg = CopySegmentAt(blockIdx.x, segments_per_block, p.block_bytes);
  const int64_t s = p.src_ids != nullptr ? p.src_ids[seg.copy] : seg.copy;
  const int64_t d = p.dst_ids != nullptr ? p.dst_ids[seg.copy] : seg.copy;
  const char* src = static_cast<const char*>(p.src) + s * p.src_block_stride_bytes + seg.begin;
  char* dst = static_cast<char*>(p.dst) + d * p.dst_block_stride_bytes + seg.begin;
  const int64_t bytes = seg.end - seg.begin;  // a multiple of access_bytes (see the launcher)
  switch (access_bytes) {
    case 16:
      CopyWords<uint4>(src, dst, bytes);
      return;
    case 8:
      CopyWords<uint2>(src, dst, bytes);
      return;
    case 4:
      CopyWords<uint32_t>(src, dst, bytes);
      return;
    case 2:
      CopyWords<uint16_t>(src, dst, bytes);
      return;
    default:
      CopyWords<unsigned char>(src, dst, bytes);
      return;
  }
}

}  // namespace

cudaError_t LaunchCopyBlocks(const CopyBlocksParams& p, cudaStream_t stream) {
  if (p.num_copies <= 0) {
    return cudaSuccess;
  }
  const LaunchShape s = CopyBlocksLaunch(p.num_copies, p.block_bytes);
  if (s.grid > kMaxGridX) {
    return cudaErrorInvalidConfiguration;
  }
  // Segment starts are multiples of kCopySegmentBytes (a multiple of 16) and block_bytes is a
  // multiple of the access size, so every segment length is too.
  const int access = CopyAccessBytes(p.src, p.dst, p.src_block_stride_bytes,
                                     p.dst_block_stride_bytes, p.block_bytes);
  CopyBlocksKernel<<<static_cast<unsigned>(s.grid), s.threads, 0, stream>>>(
      p, CopySegmentsPerBlock(p.block_bytes), access);
  return cudaGetLastError();
}

}  // namespace pd::kernels::cuda
