#include "services/base/kv_dtype_proto.h"

namespace pd::services {

pdserve::internal::v1::KvDtype KvDtypeToProto(kernels::DType dtype) {
  switch (dtype) {
    case kernels::DType::kF32:
      return pdserve::internal::v1::KV_DTYPE_FP32;
    case kernels::DType::kBF16:
      return pdserve::internal::v1::KV_DTYPE_BF16;
    case kernels::DType::kF16:
      return pdserve::internal::v1::KV_DTYPE_FP16;
    case kernels::DType::kI8:
      return pdserve::internal::v1::KV_DTYPE_INT8;
    case kernels::DType::kF8E4M3:
      return pdserve::internal::v1::KV_DTYPE_FP8_E4M3;
    case kernels::DType::kI4:
      return pdserve::internal::v1::KV_DTYPE_INT4;
    default:
      return pdserve::internal::v1::KV_DTYPE_UNSPECIFIED;
  }
}

}  // namespace pd::services
