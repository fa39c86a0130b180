// Names of the plain kernel types (kernels/types.h) for messages, configs and wire fields:
// the one spelling every layer uses. Host code only (types.h itself stays free of Abseil for
// nvcc). Thread-safe.
#pragma once

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "kernels/types.h"

namespace pd::kernels {

// "f32", "bf16", "f16", "i8", "fp8_e4m3", "i4"; "unknown" for a value outside the enum.
absl::string_view DTypeName(DType dtype);

// The DType named `name` (exactly as DTypeName spells it, case-sensitive); InvalidArgument
// listing the accepted names otherwise.
absl::StatusOr<DType> DTypeFromName(absl::string_view name);

}  // namespace pd::kernels
