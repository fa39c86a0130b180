// Parameters of the CopyBlocks op (block gather / scatter / move between KV pools and staging
// buffers, for KV transfer and tiering). Plain struct shared by every backend (included by .cu
// files: keep it free of Abseil and glog).
#pragma once

#include <cstdint>

#include "kernels/types.h"

namespace pd::kernels {

// For i in [0, num_copies): copies block_bytes bytes from
//   src + src_ids[i] * src_block_stride_bytes   to   dst + dst_ids[i] * dst_block_stride_bytes.
// A null id array means the identity (ids[i] = i), so
//   gather  (pool blocks -> contiguous staging buffer) = src_ids set, dst_ids null;
//   scatter (staging buffer -> pool blocks)            = src_ids null, dst_ids set;
//   move    (pool -> pool, e.g. copy-on-write)         = both set.
// Block contents are opaque bytes: no dtype conversion. Destination extents must not overlap
// each other or any source extent (one copy's output never feeds another).
// On kCpu src, dst and the id arrays are host memory. On kCuda the id arrays are device memory
// and src/dst are device memory or host memory the device can address (cudaHostRegister'd or
// cudaMallocHost'd), so one kernel gathers a pool on the GPU into a pinned host staging buffer.
struct CopyBlocksParams {
  const void* src = nullptr;
  void* dst = nullptr;
  const int32_t* src_ids = nullptr;  // [num_copies], each in [0, src_num_blocks), or nullptr
  const int32_t* dst_ids = nullptr;  // [num_copies], each in [0, dst_num_blocks), or nullptr
  int64_t num_copies = 0;
  int64_t block_bytes = 0;             // bytes copied per block, > 0
  int64_t src_block_stride_bytes = 0;  // >= block_bytes
  int64_t dst_block_stride_bytes = 0;  // >= block_bytes
  int64_t src_num_blocks = 0;          // blocks addressable from src (bounds the ids)
  int64_t dst_num_blocks = 0;          // blocks addressable from dst
};

}  // namespace pd::kernels
