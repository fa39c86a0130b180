// Block-scaled fp8 weights: the format of DeepSeek-V3's and Qwen3's "-FP8" checkpoints.
//
// config.json says `"quantization_config": {"quant_method": "fp8", "fmt": "e4m3",
// "weight_block_size": [BR, BC], ...}`. A quantized linear `X.weight` [rows][cols] is then
// stored as F8_E4M3 codes with a companion `X.weight_scale_inv` (F32 or BF16)
// [ceil(rows / BR)][ceil(cols / BC)]: W[r][c] = e4m3(q[r][c]) * scale_inv[r / BR][c / BC].
// Other tensors (embeddings, norms, routers, lm_head) keep their dtype.
//
// The engine dequantizes such weights at load into the checkpoint's other dtype (bf16 in the
// published ones): each product is computed in f32 and rounded once to that dtype (exact when
// the scale is a power of two, as pd-make-model writes them). Pure functions; thread-safe.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "engine/model/safetensors.h"
#include "kernels/types.h"

namespace pd::engine {

struct Fp8BlockSize {
  int32_t rows = 0;
  int32_t cols = 0;
};

// The block size of config.json's `quantization_config` (text of config.json; `source` names it
// in errors): nullopt without a quantization_config; Unimplemented naming the method for a
// quantization other than fp8 / e4m3 with a weight_block_size; InvalidArgument for a malformed
// one.
absl::StatusOr<std::optional<Fp8BlockSize>> ParseFp8Quantization(absl::string_view config_json,
                                                                 absl::string_view source);
// The same, reading DIR/config.json.
absl::StatusOr<std::optional<Fp8BlockSize>> LoadFp8Quantization(absl::string_view dir);

// "X.weight" -> "X.weight_scale_inv".
std::string Fp8ScaleName(absl::string_view weight_name);

// InvalidArgument naming `name` unless `weight` is a 2-D F8_E4M3 tensor and `scale` a 2-D F32 or
// BF16 tensor of [ceil(rows / block.rows)][ceil(cols / block.cols)].
absl::Status CheckFp8Scale(absl::string_view name, const TensorView& weight,
                           const TensorView& scale, Fp8BlockSize block);

// Writes the dequantized weight (see the file comment) into `out` ([rows][cols] of `out_dtype`:
// f32, bf16 or f16). Requires CheckFp8Scale to have passed.
void DequantizeFp8Block(const TensorView& weight, const TensorView& scale, Fp8BlockSize block,
                        kernels::DType out_dtype, void* out);

}  // namespace pd::engine
