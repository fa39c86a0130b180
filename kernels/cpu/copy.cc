#include <cstring>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/parallel.h"

namespace pd::kernels::cpu {

void CopyBlocks(const OpContext& ctx, const CopyBlocksParams& p) {
  const auto* src = static_cast<const char*>(p.src);
  auto* dst = static_cast<char*>(p.dst);
  // Blocks are large (tens of KiB to MiB): a few per task keeps every thread streaming.
  const int64_t min_copies = p.block_bytes >= (int64_t{1} << 20) ? 1 : 4;
  ParallelRange(ctx, p.num_copies, min_copies, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const int64_t s = p.src_ids != nullptr ? p.src_ids[i] : i;
      const int64_t d = p.dst_ids != nullptr ? p.dst_ids[i] : i;
      std::memcpy(dst + d * p.dst_block_stride_bytes, src + s * p.src_block_stride_bytes,
                  static_cast<size_t>(p.block_bytes));
    }
  });
}

}  // namespace pd::kernels::cpu
