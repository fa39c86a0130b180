// Validation and device dispatch for CopyBlocks.
#include "kernels/copy.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "build_config.h"
#include "common/base/status_macros.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/dispatch/validate.h"
#if PD_WITH_CUDA
#include "kernels/cuda/cuda_backend.h"
#endif

namespace pd::kernels {

using dispatch_internal::Overlaps;

namespace {

// Host-side id checks (kCpu): range, unique destinations, and within one pool no block both
// read and written (the copies run in parallel, in no particular order).
absl::Status CheckIds(const CopyBlocksParams& p, bool same_pool) {
  std::vector<int64_t> dst(p.num_copies), src(p.num_copies);
  for (int64_t i = 0; i < p.num_copies; ++i) {
    src[i] = p.src_ids != nullptr ? p.src_ids[i] : i;
    dst[i] = p.dst_ids != nullptr ? p.dst_ids[i] : i;
    if (src[i] < 0 || src[i] >= p.src_num_blocks || dst[i] < 0 || dst[i] >= p.dst_num_blocks) {
      return absl::InvalidArgumentError(
          absl::StrCat("copy_blocks: copy ", i, " from block ", src[i], " to block ", dst[i],
                       " outside [0, ", p.src_num_blocks, ") x [0, ", p.dst_num_blocks, ")"));
    }
  }
  std::sort(dst.begin(), dst.end());
  const auto dup = std::adjacent_find(dst.begin(), dst.end());
  if (dup != dst.end()) {
    return absl::InvalidArgumentError(
        absl::StrCat("copy_blocks: destination block ", *dup, " written twice"));
  }
  if (same_pool) {
    for (int64_t s : src) {
      if (std::binary_search(dst.begin(), dst.end(), s)) {
        return absl::InvalidArgumentError(
            absl::StrCat("copy_blocks: block ", s, " is both a source and a destination"));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace

bool SupportsCopyBlocks(Device device) {
  switch (device) {
    case Device::kCpu:
      return true;
    case Device::kCuda:
      return PD_WITH_CUDA;
  }
  return false;
}

absl::Status CopyBlocks(const OpContext& ctx, const CopyBlocksParams& p) {
  if (p.num_copies < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("copy_blocks: num_copies must be >= 0, got ", p.num_copies));
  }
  if (p.num_copies == 0) {
    return absl::OkStatus();
  }
  if (p.src == nullptr || p.dst == nullptr) {
    return absl::InvalidArgumentError("copy_blocks: null src or dst");
  }
  if (p.block_bytes <= 0 || p.src_block_stride_bytes < p.block_bytes ||
      p.dst_block_stride_bytes < p.block_bytes || p.src_num_blocks <= 0 || p.dst_num_blocks <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "copy_blocks: need block_bytes > 0, strides >= block_bytes and block counts > 0, got ",
        p.block_bytes, ", strides ", p.src_block_stride_bytes, " ", p.dst_block_stride_bytes,
        ", counts ", p.src_num_blocks, " ", p.dst_num_blocks));
  }
  if ((p.src_ids == nullptr && p.num_copies > p.src_num_blocks) ||
      (p.dst_ids == nullptr && p.num_copies > p.dst_num_blocks)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "copy_blocks: ", p.num_copies, " identity-indexed copies exceed the block count (src ",
        p.src_num_blocks, ", dst ", p.dst_num_blocks, ")"));
  }
  const int64_t src_bytes = (p.src_num_blocks - 1) * p.src_block_stride_bytes + p.block_bytes;
  const int64_t dst_bytes = (p.dst_num_blocks - 1) * p.dst_block_stride_bytes + p.block_bytes;
  const bool same_pool = p.src == p.dst && p.src_block_stride_bytes == p.dst_block_stride_bytes;
  if (!same_pool && Overlaps(p.src, src_bytes, p.dst, dst_bytes)) {
    return absl::InvalidArgumentError("copy_blocks: src and dst pools partly overlap");
  }
  if (!SupportsCopyBlocks(ctx.device)) {
    return dispatch_internal::NoBackend("copy_blocks", ctx.device, DType::kF32);
  }
#if PD_WITH_CUDA
  if (ctx.device == Device::kCuda) {
    return cuda::CopyBlocks(ctx, p);  // ids are device memory: not read here
  }
#endif
  PD_RETURN_IF_ERROR(CheckIds(p, same_pool));
  cpu::CopyBlocks(ctx, p);
  return absl::OkStatus();
}

}  // namespace pd::kernels
