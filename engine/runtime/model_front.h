// ModelFront: what a front end (pd-router) needs to know about a model without running it:
// its configuration, tokenizer and fingerprint, loaded from the same path a worker is given.
// The fingerprint is computed exactly as the workers compute it, so block-hash chains match.
//
// Immutable after Load; thread-safe.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "engine/model/model_config.h"
#include "engine/model/tokenizer.h"

namespace pd::engine {

class ModelFront {
 public:
  // `model` is a Hugging Face directory or a llama2.c checkpoint (then `tokenizer` is its
  // tokenizer.bin; for directories an empty `tokenizer` means DIR/tokenizer.json). Errors as
  // ModelRuntime::Create.
  static absl::StatusOr<std::unique_ptr<ModelFront>> Load(const std::string& model,
                                                          const std::string& tokenizer);

  const ModelConfig& config() const { return config_; }
  const Tokenizer& tokenizer() const { return *tokenizer_; }
  const std::string& fingerprint() const { return fingerprint_; }
  // Whether text prompts get a BOS token (the model has one).
  bool add_bos() const { return config_.bos_id != ModelConfig::kNoToken; }

 private:
  ModelFront() = default;
  ModelConfig config_;
  std::unique_ptr<Tokenizer> tokenizer_;
  std::string fingerprint_;
};

}  // namespace pd::engine
