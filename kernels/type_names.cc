#include "kernels/type_names.h"

#include <string>

#include "absl/strings/str_cat.h"

namespace pd::kernels {
namespace {

constexpr DType kAllDTypes[] = {DType::kF32, DType::kBF16, DType::kF16,
                                DType::kI8,  DType::kF8E4M3, DType::kI4};

}  // namespace

absl::string_view DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return "f32";
    case DType::kBF16:
      return "bf16";
    case DType::kF16:
      return "f16";
    case DType::kI8:
      return "i8";
    case DType::kF8E4M3:
      return "fp8_e4m3";
    case DType::kI4:
      return "i4";
  }
  return "unknown";
}

absl::StatusOr<DType> DTypeFromName(absl::string_view name) {
  std::string accepted;
  for (DType dtype : kAllDTypes) {
    if (DTypeName(dtype) == name) {
      return dtype;
    }
    absl::StrAppend(&accepted, accepted.empty() ? "" : ", ", DTypeName(dtype));
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown dtype \"", name, "\"; accepted: ", accepted));
}

}  // namespace pd::kernels
