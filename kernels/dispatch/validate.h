// Shared argument checks of kernels/dispatch. Private to kernels/dispatch.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/attention_params.h"
#include "kernels/type_names.h"
#include "kernels/types.h"

namespace pd::kernels::dispatch_internal {

const char* DeviceName(Device device);

// Elements spanned by `rows` rows of `cols` elements, `stride` apart (rows, cols > 0).
inline int64_t Span(int64_t rows, int64_t stride, int64_t cols) {
  return (rows - 1) * stride + cols;
}

// Whether byte ranges [a, a + a_bytes) and [b, b + b_bytes) intersect.
bool Overlaps(const void* a, int64_t a_bytes, const void* b, int64_t b_bytes);

// InvalidArgument naming `op` unless the view is usable (see kernels/attention.h).
absl::Status CheckKvCacheView(const char* op, const KvCacheView& c);

// InvalidArgument naming `op` unless table[0, count) are all in [0, num_blocks).
absl::Status CheckBlockIds(const char* op, const int32_t* table, int64_t count, int64_t num_blocks);

// Whether `dtype` is an activation/weight dtype (f32, bf16, f16): not a quantized KV-cache dtype
// and not a value outside the enum.
bool IsDenseDType(DType dtype);

// InvalidArgument naming `op` and `what` (e.g. "weight") unless IsDenseDType(dtype).
absl::Status CheckDenseDType(const char* op, const char* what, DType dtype);

// Unimplemented naming `op`, device and dtype.
absl::Status NoBackend(const char* op, Device device, DType dtype);

}  // namespace pd::kernels::dispatch_internal
