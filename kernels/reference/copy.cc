#include "kernels/reference/reference_ops.h"

namespace pd::kernels::reference {

void CopyBlocks(const CopyBlocksParams& p) {
  const auto* src = static_cast<const unsigned char*>(p.src);
  auto* dst = static_cast<unsigned char*>(p.dst);
  for (int64_t i = 0; i < p.num_copies; ++i) {
    const int64_t s = p.src_ids != nullptr ? p.src_ids[i] : i;
    const int64_t d = p.dst_ids != nullptr ? p.dst_ids[i] : i;
    for (int64_t b = 0; b < p.block_bytes; ++b) {
      dst[d * p.dst_block_stride_bytes + b] = src[s * p.src_block_stride_bytes + b];
    }
  }
}

}  // namespace pd::kernels::reference
