// ModelFront: what a front end (pd-router) needs to know about a model without running it:
// its configuration, tokenizer and fingerprint, loaded from the same path a worker is given.
// The fingerprint is computed exactly as the workers compute it, so block-hash chains match.
//
// Immutable after Load; thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "engine/model/model_config.h"
#include "engine/model/tokenizer.h"

namespace pd::engine {

// How the linear matrices are stored (--weight_dtype). kAuto: as in the checkpoint. kInt8: each
// quantized at load to int8 with per-row scales (W8A8 matmuls, kernels/matmul_params.h; about
// half the bytes of bf16 per decode step, on CPU and CUDA); the fingerprint gets "+w8"
// (kInt8FingerprintSuffix) on every process given the flag: workers, pd-router and pd-tierd of a
// cluster must agree, as for
// --kv_dtype.
enum class WeightDType : uint8_t { kAuto = 0, kInt8 = 1 };

// "auto" -> kAuto, "int8" -> kInt8; InvalidArgument listing the accepted names otherwise.
absl::StatusOr<WeightDType> ParseWeightDType(absl::string_view name);
// "auto" or "int8".
absl::string_view WeightDTypeName(WeightDType dtype);

// Whether text prompts of `model` get a BOS token, as Hugging Face's tokenizer adds one (encode
// with special tokens): a llama2.c checkpoint when its config has a BOS; a Hugging Face
// directory when its tokenizer_config.json says `add_bos_token: true` or, without that field,
// when tokenizer.json's post-processor starts with a special token (Llama 3, Mistral), and the
// tokenizer has a BOS. Not from config.json's bos_token_id: Qwen names one there that its
// tokenizer never adds. `tokenizer` and `config` are the model's, as loaded.
bool AddsBos(const std::string& model, const Tokenizer& tokenizer, const ModelConfig& config);

class ModelFront {
 public:
  // `model` is a Hugging Face directory or a llama2.c checkpoint (then `tokenizer` is its
  // tokenizer.bin; for directories an empty `tokenizer` means DIR/tokenizer.json).
  // `weight_dtype` is the workers' --weight_dtype (it changes their fingerprint). Errors as
  // ModelRuntime::Create.
  static absl::StatusOr<std::unique_ptr<ModelFront>> Load(
      const std::string& model, const std::string& tokenizer,
      WeightDType weight_dtype = WeightDType::kAuto);

  const ModelConfig& config() const { return config_; }
  const Tokenizer& tokenizer() const { return *tokenizer_; }
  const std::string& fingerprint() const { return fingerprint_; }
  // Whether text prompts get a BOS token (AddsBos).
  bool add_bos() const { return add_bos_; }

 private:
  ModelFront() = default;
  ModelConfig config_;
  bool add_bos_ = true;
  std::unique_ptr<Tokenizer> tokenizer_;
  std::string fingerprint_;
};

}  // namespace pd::engine
