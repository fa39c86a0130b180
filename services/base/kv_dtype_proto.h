// The wire value of a KV cache dtype (pdserve.internal.v1.KvDtype). Apart from
// kv_layout_proto.h so that pd-router, which links nothing of the engine, can compare a worker's
// layout dtype with its own --kv_dtype.
#pragma once

#include "kernels/types.h"
#include "pd/v1/worker.pb.h"

namespace pd::services {

// KV_DTYPE_UNSPECIFIED for a dtype the proto does not name (never equal to a real one).
pdserve::internal::v1::KvDtype KvDtypeToProto(kernels::DType dtype);

}  // namespace pd::services
