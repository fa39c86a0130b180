#include "engine/runtime/model_front.h"

#include <sys/stat.h>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "engine/model/hf_model.h"
#include "engine/model/hf_tokenizer.h"
#include "engine/model/llama2c_checkpoint.h"
#include "engine/model/llama2c_tokenizer.h"

namespace pd::engine {

absl::StatusOr<WeightDType> ParseWeightDType(absl::string_view name) {
  if (name == "auto") {
    return WeightDType::kAuto;
  }
  if (name == "int8") {
    return WeightDType::kInt8;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("--weight_dtype must be auto or int8, got \"", name, "\""));
}

absl::string_view WeightDTypeName(WeightDType dtype) {
  return dtype == WeightDType::kInt8 ? "int8" : "auto";
}

absl::StatusOr<std::unique_ptr<ModelFront>> ModelFront::Load(const std::string& model,
                                                             const std::string& tokenizer,
                                                             WeightDType weight_dtype) {
  std::unique_ptr<ModelFront> f(new ModelFront());
  struct stat st;
  if (model.empty() || ::stat(model.c_str(), &st) != 0) {
    return absl::NotFoundError(absl::StrCat("model '", model, "' does not exist"));
  }
  if (S_ISDIR(st.st_mode)) {
    // The loader's config and fingerprint are what ModelWeights carries to the workers; the
    // weights themselves (and the kernels that convert them) are not needed here.
    PD_ASSIGN_OR_RETURN(HfModel hf, HfModel::Load(model));
    f->config_ = hf.config();
    f->fingerprint_ = hf.Fingerprint();
    const std::string path = tokenizer.empty() ? absl::StrCat(model, "/tokenizer.json") : tokenizer;
    PD_ASSIGN_OR_RETURN(HfTokenizer tok, HfTokenizer::Load(path));
    f->tokenizer_ = std::make_unique<HfTokenizer>(std::move(tok));
  } else {
    if (tokenizer.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "model ", model, " is a llama2.c checkpoint: pass its tokenizer.bin with --tokenizer"));
    }
    PD_ASSIGN_OR_RETURN(Llama2cCheckpoint ckpt, Llama2cCheckpoint::Load(model));
    f->config_ = ckpt.config();
    f->fingerprint_ = ckpt.Fingerprint();
    PD_ASSIGN_OR_RETURN(Llama2cTokenizer tok,
                        Llama2cTokenizer::Load(tokenizer, f->config_.vocab_size));
    f->tokenizer_ = std::make_unique<Llama2cTokenizer>(std::move(tok));
  }
  if (weight_dtype == WeightDType::kInt8) {
    f->fingerprint_ += kInt8FingerprintSuffix;  // as QuantizeWeightsInt8 does on the workers
  }
  return f;
}

}  // namespace pd::engine
