#include "services/router/prompt_encoder.h"

#include <sys/stat.h>

#include <fstream>
#include <sstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/log/log.h"
#include "nlohmann/json.hpp"

namespace pd::router {
namespace {

namespace v1 = pdserve::v1;
using json = nlohmann::json;

// `bos_token` / `eos_token` of a tokenizer_config.json: a string or {"content": ...}.
std::string SpecialToken(const json& config, const char* key) {
  auto it = config.find(key);
  if (it == config.end()) return "";
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object() && it->contains("content") && (*it)["content"].is_string()) {
    return (*it)["content"].get<std::string>();
  }
  return "";
}

absl::StatusOr<std::string> ReadWholeFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", path));
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

bool IsDirectory(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

}  // namespace

absl::StatusOr<std::unique_ptr<chat::ChatTemplate>> LoadChatTemplate(
    const std::string& model, const std::string& file, const chat::ChatTemplateLimits& limits) {
  const bool hf_dir = IsDirectory(model);
  if (file.empty()) {
    if (!hf_dir) return nullptr;  // llama2.c: no template
    absl::StatusOr<chat::ChatTemplate> t = chat::ChatTemplate::FromModelDir(model, limits);
    if (absl::IsNotFound(t.status())) {
      LOG(WARNING) << "http: " << model << " has no chat template: /v1/chat/completions "
                   << "answers 400 (give one with --chat_template)";
      return nullptr;
    }
    if (!t.ok()) return t.status();
    return std::make_unique<chat::ChatTemplate>(*std::move(t));
  }
  PD_ASSIGN_OR_RETURN(std::string source, ReadWholeFile(file));
  std::string bos, eos;
  if (hf_dir) {
    absl::StatusOr<std::string> config = ReadWholeFile(model + "/tokenizer_config.json");
    if (config.ok()) {
      const json j = json::parse(*config, nullptr, false);
      if (j.is_object()) {
        bos = SpecialToken(j, "bos_token");
        eos = SpecialToken(j, "eos_token");
      }
    }
  }
  absl::StatusOr<chat::ChatTemplate> t =
      chat::ChatTemplate::Create(std::move(source), std::move(bos), std::move(eos), limits);
  if (!t.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--chat_template ", file, ": ", t.status().message()));
  }
  return std::make_unique<chat::ChatTemplate>(*std::move(t));
}

PromptEncoder::PromptEncoder(const engine::ModelFront* model,
                             std::unique_ptr<chat::ChatTemplate> chat_template)
    : model_(model), chat_template_(std::move(chat_template)) {}

absl::StatusOr<std::vector<uint32_t>> PromptEncoder::Encode(
    const v1::GenerateRequest& request) const {
  switch (request.prompt_case()) {
    case v1::GenerateRequest::kText:
      return model_->tokenizer().Encode(request.text(), model_->add_bos(), false);
    case v1::GenerateRequest::kTokenIds: {
      const int32_t vocab_size = model_->config().vocab_size;
      for (int i = 0; i < request.token_ids().ids_size(); ++i) {
        const uint32_t t = request.token_ids().ids(i);
        if (t >= static_cast<uint32_t>(vocab_size)) {
          return absl::InvalidArgumentError(absl::StrCat(
              "token_ids[", i, "] = ", t, " is out of range: vocabulary size is ", vocab_size));
        }
      }
      return std::vector<uint32_t>(request.token_ids().ids().begin(),
                                   request.token_ids().ids().end());
    }
    case v1::GenerateRequest::PROMPT_NOT_SET:
      break;
  }
  return absl::InvalidArgumentError("prompt: set exactly one of text or token_ids");
}

absl::StatusOr<std::vector<uint32_t>> PromptEncoder::EncodeChat(
    const std::vector<chat::ChatMessage>& messages, bool add_generation_prompt,
    const chat::Value& extra_vars) const {
  if (chat_template_ == nullptr) {
    return absl::InvalidArgumentError(
        "this model has no chat template (no chat_template in its tokenizer_config.json): use "
        "/v1/completions, or start pd-router with --chat_template FILE");
  }
  absl::StatusOr<std::string> text =
      chat_template_->Render(messages, add_generation_prompt, extra_vars);
  if (!text.ok()) {
    // Too many renders at once: the client may retry; any other failure is the request's.
    if (absl::IsUnavailable(text.status())) return text.status();
    return absl::InvalidArgumentError(absl::StrCat("chat template: ", text.status().message()));
  }
  // A template that writes the BOS token itself gets no second one from the tokenizer.
  const bool add_bos = model_->add_bos() && chat_template_->bos_token().empty();
  return model_->tokenizer().Encode(*text, add_bos, false);
}

}  // namespace pd::router
