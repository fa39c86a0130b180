#include "engine/runtime/model_front.h"

#include <sys/stat.h>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "engine/model/hf_model.h"
#include "engine/model/hf_tokenizer.h"
#include "engine/model/llama2c_checkpoint.h"
#include "engine/model/llama2c_tokenizer.h"
#include "engine/model/model_weights.h"

namespace pd::engine {

absl::StatusOr<std::unique_ptr<ModelFront>> ModelFront::Load(const std::string& model,
                                                             const std::string& tokenizer) {
  std::unique_ptr<ModelFront> f(new ModelFront());
  struct stat st;
  if (model.empty() || ::stat(model.c_str(), &st) != 0) {
    return absl::NotFoundError(absl::StrCat("model '", model, "' does not exist"));
  }
  if (S_ISDIR(st.st_mode)) {
    PD_ASSIGN_OR_RETURN(HfModel hf, HfModel::Load(model));
    PD_ASSIGN_OR_RETURN(ModelWeights w, WeightsFromHf(hf));
    f->config_ = w.config;
    f->fingerprint_ = w.fingerprint;
    const std::string path = tokenizer.empty() ? absl::StrCat(model, "/tokenizer.json") : tokenizer;
    PD_ASSIGN_OR_RETURN(HfTokenizer tok, HfTokenizer::Load(path));
    f->tokenizer_ = std::make_unique<HfTokenizer>(std::move(tok));
  } else {
    if (tokenizer.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "model ", model, " is a llama2.c checkpoint: pass its tokenizer.bin with --tokenizer"));
    }
    PD_ASSIGN_OR_RETURN(Llama2cCheckpoint ckpt, Llama2cCheckpoint::Load(model));
    ModelWeights w = WeightsFromLlama2c(ckpt);
    f->config_ = w.config;
    f->fingerprint_ = w.fingerprint;
    PD_ASSIGN_OR_RETURN(Llama2cTokenizer tok,
                        Llama2cTokenizer::Load(tokenizer, w.config.vocab_size));
    f->tokenizer_ = std::make_unique<Llama2cTokenizer>(std::move(tok));
  }
  return f;
}

}  // namespace pd::engine
