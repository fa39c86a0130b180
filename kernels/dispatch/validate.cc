#include "kernels/dispatch/validate.h"

#include <algorithm>
#include <cstdint>

#include "absl/strings/str_cat.h"

namespace pd::kernels::dispatch_internal {

const char* DeviceName(Device device) {
  switch (device) {
    case Device::kCpu:
      return "cpu";
    case Device::kCuda:
      return "cuda";
  }
  return "unknown";
}

bool Overlaps(const void* a, int64_t a_bytes, const void* b, int64_t b_bytes) {
  const auto a0 = reinterpret_cast<uintptr_t>(a), b0 = reinterpret_cast<uintptr_t>(b);
  return a0 < b0 + static_cast<uintptr_t>(b_bytes) && b0 < a0 + static_cast<uintptr_t>(a_bytes);
}

namespace {

// The scale region of a quantized view: aligned floats, after the layer's data (which ends at
// byte data_end of the block), inside the block.
absl::Status CheckKvScales(const char* op, const KvCacheView& c, int64_t data_end) {
  if (reinterpret_cast<uintptr_t>(c.base) % 4 != 0 || c.block_stride % 4 != 0 ||
      c.scale_offset % 4 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": ", DTypeName(c.dtype), " cache base, block_stride ", c.block_stride,
                     " and scale_offset ", c.scale_offset, " must be multiples of 4 bytes"));
  }
  const int64_t head_scales = c.block_size * KvScalesPerRow(c.dtype, c.head_dim);
  if (c.scale_head_stride < head_scales || c.scale_kv_stride <= 0 || c.scale_layer_stride <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": ", DTypeName(c.dtype), " cache scale strides (layer ", c.scale_layer_stride, " kv ",
        c.scale_kv_stride, " head ", c.scale_head_stride,
        ") must be > 0, the head stride >= block_size * scales per row ", head_scales));
  }
  const int64_t k_scales = (c.num_kv_heads - 1) * c.scale_head_stride + head_scales;
  if (c.scale_kv_stride < k_scales) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": cache scale_kv_stride ", c.scale_kv_stride, " < K scale extent ", k_scales));
  }
  const int64_t scales_end =
      c.scale_offset + 4 * (c.layer * c.scale_layer_stride + c.scale_kv_stride + k_scales);
  if (c.scale_offset < data_end || scales_end > c.block_stride) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": layer ", c.layer, " scales [", c.scale_offset, ", ", scales_end,
                     ") must start after its data (byte ", data_end,
                     ") and end within block_stride ", c.block_stride));
  }
  // The scale region has room for `layers` layers' scales; the data of every one of those
  // layers (not only this view's) must end before it, so no view of the same block can write
  // codes over another layer's scales. (Layers past `layers` have no room for their scales:
  // their views fail the check above.)
  const int64_t layers =
      std::max(c.layer + 1, (c.block_stride - c.scale_offset) / (4 * c.scale_layer_stride));
  const int64_t all_data_end = data_end + (layers - 1 - c.layer) * c.layer_stride;
  if (c.scale_offset < all_data_end) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": the scale region at byte ", c.scale_offset, " holds scales of ", layers,
                     " layers but overlaps the data of layer ", layers - 1, " (ends at byte ",
                     all_data_end, ")"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckKvCacheView(const char* op, const KvCacheView& c) {
  if (c.base == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": null cache base"));
  }
  if (c.num_blocks <= 0 || c.block_size <= 0 || c.num_kv_heads <= 0 || c.head_dim <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": cache num_blocks, block_size, num_kv_heads and head_dim must be > 0, got ",
        c.num_blocks, ", ", c.block_size, ", ", c.num_kv_heads, ", ", c.head_dim));
  }
  if (c.head_dim > kMaxAttentionHeadDim) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": head_dim ", c.head_dim, " > ", kMaxAttentionHeadDim));
  }
  if (c.block_stride <= 0 || c.layer_stride <= 0 || c.kv_stride <= 0 || c.head_stride <= 0 ||
      c.layer < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": cache strides must be > 0 and layer >= 0, got block ", c.block_stride,
                     " layer ", c.layer_stride, " kv ", c.kv_stride, " head ", c.head_stride,
                     " (layer index ", c.layer, ")"));
  }
  if (c.dtype == DType::kI4 && c.head_dim % 2 != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": an i4 cache needs an even head_dim (two codes a byte), got ", c.head_dim));
  }
  const int64_t head_extent = c.block_size * KvRowPitch(c.dtype, c.head_dim);
  const int64_t k_extent = (c.num_kv_heads - 1) * c.head_stride + head_extent;
  if (c.head_stride < head_extent || c.kv_stride < k_extent) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": cache head_stride ", c.head_stride, " < block_size * row pitch ",
                     head_extent, " or kv_stride ", c.kv_stride, " < K extent ", k_extent));
  }
  const int64_t data_end = c.layer * c.layer_stride + c.kv_stride + k_extent;
  if (data_end > c.block_stride) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": layer ", c.layer, " K/V extent ends past block_stride ", c.block_stride));
  }
  if (c.first_head < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": cache first_head ", c.first_head, " is negative"));
  }
  if (c.first_head == 0) {
    return IsQuantizedKvDType(c.dtype) ? CheckKvScales(op, c, data_end) : absl::OkStatus();
  }
  // A view of heads [first_head, first_head + n) of a pool: check the pool's heads
  // [0, first_head + n) from the block's real start (where a quantized scale region begins).
  const int64_t pool_heads = c.first_head + c.num_kv_heads;
  const int64_t pool_k_extent = (pool_heads - 1) * c.head_stride + head_extent;
  const int64_t pool_data_end = c.layer * c.layer_stride + c.kv_stride + pool_k_extent;
  if (c.kv_stride < pool_k_extent || pool_data_end > c.block_stride) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": cache kv_stride ", c.kv_stride, " or block_stride ", c.block_stride,
                     " too small for the pool's heads [0, ", pool_heads,
                     ") (a view from first_head ", c.first_head, ")"));
  }
  if (!IsQuantizedKvDType(c.dtype)) return absl::OkStatus();
  KvCacheView pool = c;
  const int64_t shift = c.first_head * c.head_stride;  // bytes (a quantized element is one)
  pool.base = static_cast<char*>(c.base) - shift;
  pool.num_kv_heads = pool_heads;
  pool.scale_offset = c.scale_offset + shift - 4 * c.first_head * c.scale_head_stride;
  pool.first_head = 0;
  return CheckKvScales(op, pool, pool_data_end);
}

absl::Status CheckBlockIds(const char* op, const int32_t* table, int64_t count,
                           int64_t num_blocks) {
  for (int64_t i = 0; i < count; ++i) {
    if (table[i] < 0 || table[i] >= num_blocks) {
      return absl::InvalidArgumentError(absl::StrCat(op, ": block table entry ", i, " = ", table[i],
                                                     " outside [0, ", num_blocks, ")"));
    }
  }
  return absl::OkStatus();
}

bool IsDenseDType(DType dtype) {
  return dtype == DType::kF32 || dtype == DType::kBF16 || dtype == DType::kF16;
}

absl::Status CheckDenseDType(const char* op, const char* what, DType dtype) {
  if (IsDenseDType(dtype)) {
    return absl::OkStatus();
  }
  if (IsQuantizedKvDType(dtype)) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": ", what, " dtype ", DTypeName(dtype),
                                                   " is a KV-cache-only dtype; ", op,
                                                   " takes f32, bf16 or f16"));
  }
  return absl::InvalidArgumentError(
      absl::StrCat(op, ": unknown ", what, " dtype ", static_cast<int>(dtype)));
}

absl::Status NoBackend(const char* op, Device device, DType dtype) {
  return absl::UnimplementedError(absl::StrCat(op, ": no implementation for device ",
                                               DeviceName(device), " dtype ", DTypeName(dtype)));
}

}  // namespace pd::kernels::dispatch_internal
