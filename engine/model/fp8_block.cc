#include "engine/model/fp8_block.h"

#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "engine/model/mapped_file.h"
#include "kernels/half.h"
#include "nlohmann/json.hpp"

namespace pd::engine {

absl::StatusOr<std::optional<Fp8BlockSize>> ParseFp8Quantization(absl::string_view config_json,
                                                                 absl::string_view source) {
  const nlohmann::json j = nlohmann::json::parse(config_json, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": not a JSON object"));
  }
  auto it = j.find("quantization_config");
  if (it == j.end() || it->is_null()) {
    return std::nullopt;
  }
  const nlohmann::json& q = *it;
  auto text = [&](const char* key) -> std::string {
    auto f = q.is_object() ? q.find(key) : q.end();
    return f != q.end() && f->is_string() ? f->get<std::string>() : std::string();
  };
  const std::string method = text("quant_method"), fmt = text("fmt");
  if (method != "fp8" || (!fmt.empty() && fmt != "e4m3")) {
    return absl::UnimplementedError(
        absl::StrCat(source, ": quantization_config quant_method \"", method, "\" fmt \"", fmt,
                     "\" is not supported (only fp8 e4m3 with a weight_block_size)"));
  }
  auto block = q.find("weight_block_size");
  if (block == q.end() || !block->is_array() || block->size() != 2 ||
      !(*block)[0].is_number_integer() || !(*block)[1].is_number_integer() ||
      (*block)[0].get<int64_t>() < 1 || (*block)[1].get<int64_t>() < 1 ||
      (*block)[0].get<int64_t>() > (1 << 20) || (*block)[1].get<int64_t>() > (1 << 20)) {
    return absl::UnimplementedError(
        absl::StrCat(source,
                     ": fp8 quantization_config needs weight_block_size [rows, cols] (positive "
                     "integers); per-tensor fp8 scales are not supported"));
  }
  return Fp8BlockSize{static_cast<int32_t>((*block)[0].get<int64_t>()),
                      static_cast<int32_t>((*block)[1].get<int64_t>())};
}

absl::StatusOr<std::optional<Fp8BlockSize>> LoadFp8Quantization(absl::string_view dir) {
  const std::string path = absl::StrCat(dir, "/config.json");
  PD_ASSIGN_OR_RETURN(MappedFile file, MappedFile::Open(path));
  return ParseFp8Quantization(file.contents(), path);
}

std::string Fp8ScaleName(absl::string_view weight_name) {
  return absl::StrCat(weight_name, "_scale_inv");
}

absl::Status CheckFp8Scale(absl::string_view name, const TensorView& weight,
                           const TensorView& scale, Fp8BlockSize block) {
  if (weight.dtype != SafetensorsDtype::kF8E4M3 || weight.shape.size() != 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("fp8 weight ", name, " must be a 2-D F8_E4M3 tensor, got ",
                     SafetensorsDtypeName(weight.dtype), " ", weight.ShapeString()));
  }
  const int64_t rows = (weight.shape[0] + block.rows - 1) / block.rows;
  const int64_t cols = (weight.shape[1] + block.cols - 1) / block.cols;
  if ((scale.dtype != SafetensorsDtype::kF32 && scale.dtype != SafetensorsDtype::kBF16) ||
      scale.shape != std::vector<int64_t>{rows, cols}) {
    return absl::InvalidArgumentError(absl::StrCat(
        "fp8 weight ", name, " ", weight.ShapeString(), " in blocks of [", block.rows, ", ",
        block.cols, "] needs ", Fp8ScaleName(name), " of F32 or BF16 [", rows, ", ", cols,
        "], got ", SafetensorsDtypeName(scale.dtype), " ", scale.ShapeString()));
  }
  return absl::OkStatus();
}

void DequantizeFp8Block(const TensorView& weight, const TensorView& scale, Fp8BlockSize block,
                        kernels::DType out_dtype, void* out) {
  const int64_t rows = weight.shape[0], cols = weight.shape[1];
  const int64_t scale_cols = (cols + block.cols - 1) / block.cols;
  const auto* codes = static_cast<const uint8_t*>(weight.data);
  auto scale_at = [&](int64_t r, int64_t c) {
    const int64_t i = (r / block.rows) * scale_cols + c / block.cols;
    if (scale.dtype == SafetensorsDtype::kF32) {
      float f;
      std::memcpy(&f, static_cast<const uint8_t*>(scale.data) + 4 * i, 4);
      return f;
    }
    uint16_t h;
    std::memcpy(&h, static_cast<const uint8_t*>(scale.data) + 2 * i, 2);
    return kernels::Bf16ToF32(h);
  };
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      const float v = kernels::E4M3ToF32(codes[r * cols + c]) * scale_at(r, c);
      const int64_t i = r * cols + c;
      switch (out_dtype) {
        case kernels::DType::kBF16:
          static_cast<uint16_t*>(out)[i] = kernels::F32ToBf16(v);
          break;
        case kernels::DType::kF16:
          static_cast<uint16_t*>(out)[i] = kernels::F32ToF16(v);
          break;
        default:
          static_cast<float*>(out)[i] = v;
          break;
      }
    }
  }
}

}  // namespace pd::engine
