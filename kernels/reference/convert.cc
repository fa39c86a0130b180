#include "kernels/half.h"
#include "kernels/reference/reference_ops.h"

namespace pd::kernels::reference {
namespace {

float LoadAsF32(const void* base, DType dtype, int64_t i) {
  switch (dtype) {
    case DType::kF32:
      return static_cast<const float*>(base)[i];
    case DType::kBF16:
      return Bf16ToF32(static_cast<const uint16_t*>(base)[i]);
    case DType::kF16:
      return F16ToF32(static_cast<const uint16_t*>(base)[i]);
    case DType::kI8:
    case DType::kF8E4M3:
    case DType::kI4:
      break;  // KV-cache-only dtypes: Convert rejects them
  }
  return 0.0f;
}

void StoreFromF32(void* base, DType dtype, int64_t i, float v) {
  switch (dtype) {
    case DType::kF32:
      static_cast<float*>(base)[i] = v;
      return;
    case DType::kBF16:
      static_cast<uint16_t*>(base)[i] = F32ToBf16(v);
      return;
    case DType::kF16:
      static_cast<uint16_t*>(base)[i] = F32ToF16(v);
      return;
    case DType::kI8:
    case DType::kF8E4M3:
    case DType::kI4:
      return;  // KV-cache-only dtypes: Convert rejects them
  }
}

}  // namespace

void Convert(const ConvertParams& p) {
  if (p.in_dtype == p.out_dtype) {
    // Bitwise copy: keeps NaN payloads exactly as the bulk kernels do.
    const auto* in = static_cast<const unsigned char*>(p.in);
    auto* out = static_cast<unsigned char*>(p.out);
    for (int64_t i = 0; i < p.n * DTypeSize(p.in_dtype); ++i) {
      out[i] = in[i];
    }
    return;
  }
  for (int64_t i = 0; i < p.n; ++i) {
    StoreFromF32(p.out, p.out_dtype, i, LoadAsF32(p.in, p.in_dtype, i));
  }
}

}  // namespace pd::kernels::reference
