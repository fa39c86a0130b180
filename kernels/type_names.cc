#include "kernels/type_names.h"

#include "absl/strings/str_cat.h"

namespace pd::kernels {

absl::string_view DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return "f32";
    case DType::kBF16:
      return "bf16";
    case DType::kF16:
      return "f16";
  }
  return "unknown";
}

absl::StatusOr<DType> DTypeFromName(absl::string_view name) {
  for (const DType d : {DType::kF32, DType::kBF16, DType::kF16}) {
    if (name == DTypeName(d)) return d;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown dtype '", name, "' (expected f32, bf16 or f16)"));
}

}  // namespace pd::kernels
