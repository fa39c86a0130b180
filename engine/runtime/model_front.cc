#include "engine/runtime/model_front.h"

#include <sys/stat.h>

#include <fstream>
#include <optional>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "engine/model/hf_model.h"
#include "engine/model/hf_tokenizer.h"
#include "engine/model/llama2c_checkpoint.h"
#include "engine/model/llama2c_tokenizer.h"
#include "nlohmann/json.hpp"

namespace pd::engine {
namespace {

// tokenizer_config.json's "add_bos_token" when it is a bool (transformers' fast tokenizers
// rebuild their post-processor from it); nullopt when the file or the field is missing, or the
// file does not parse (the chat template's loader reports that).
std::optional<bool> ConfigAddBos(const std::string& model_dir) {
  std::ifstream in(absl::StrCat(model_dir, "/tokenizer_config.json"));
  if (!in) return std::nullopt;
  std::stringstream text;
  text << in.rdbuf();
  const nlohmann::json j = nlohmann::json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return std::nullopt;
  auto it = j.find("add_bos_token");
  if (it == j.end() || !it->is_boolean()) return std::nullopt;
  return it->get<bool>();
}

}  // namespace

bool AddsBos(const std::string& model, const Tokenizer& tokenizer, const ModelConfig& config) {
  struct stat st;
  if (::stat(model.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    return config.bos_id != ModelConfig::kNoToken;  // llama2.c
  }
  const auto* hf = dynamic_cast<const HfTokenizer*>(&tokenizer);
  const bool by_default = hf != nullptr && hf->add_bos_by_default();
  return ConfigAddBos(model).value_or(by_default) && tokenizer.bos_id() != Tokenizer::kNoToken;
}

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
  f->add_bos_ = AddsBos(model, *f->tokenizer_, f->config_);
  if (weight_dtype == WeightDType::kInt8) {
    f->fingerprint_ += kInt8FingerprintSuffix;  // as QuantizeWeightsInt8 does on the workers
  }
  return f;
}

}  // namespace pd::engine
