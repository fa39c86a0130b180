// PromptEncoder: the one place where pd-router turns a prompt into token ids, for every front
// end: a GenerateRequest's text or token ids (the gRPC API and /v1/completions, through
// GenerationService) and chat messages rendered by the model's chat template
// (/v1/chat/completions). The tokens are what the block hashes, the placement and the workers
// see, so both APIs count a prompt's tokens the same way.
//
// Thread-safety: immutable after construction (the chat template counts its renders in
// flight); every method may be called from any thread.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/chat/chat_template.h"
#include "engine/runtime/model_front.h"
#include "pd/v1/generation.pb.h"

namespace pd::router {

// The chat template for /v1/chat/completions: `file` (a Jinja file, the --chat_template flag)
// when set, else the model's (a Hugging Face directory's tokenizer_config.json chat_template or
// chat_template.jinja); null when the model has none (llama2.c checkpoints). BOS/EOS come from
// the directory's tokenizer_config.json ("" for llama2.c). Errors: NotFound for an unreadable
// file, InvalidArgument for a template that does not parse (naming the file). Its renders are
// bounded by `limits`.
absl::StatusOr<std::unique_ptr<chat::ChatTemplate>> LoadChatTemplate(
    const std::string& model, const std::string& file, const chat::ChatTemplateLimits& limits = {});

class PromptEncoder {
 public:
  // `model` must outlive the encoder; `chat_template` may be null (the model has none: chat
  // prompts are refused).
  PromptEncoder(const engine::ModelFront* model, std::unique_ptr<chat::ChatTemplate> chat_template);

  // The prompt of a validated `request` (ValidateGenerateRequest): its text tokenized, with BOS
  // when the model has one, or its token ids as sent. Errors: InvalidArgument naming
  // token_ids[i] for an id outside the vocabulary; the tokenizer's for text it cannot encode;
  // InvalidArgument when no prompt is set.
  absl::StatusOr<std::vector<uint32_t>> Encode(const pdserve::v1::GenerateRequest& request) const;

  // `messages` rendered by the chat template (with the assistant's turn opened when
  // `add_generation_prompt`), then tokenized: BOS as for text, unless the template writes it
  // itself (it has a bos_token). Errors: InvalidArgument "this model has no chat template ..."
  // without a template; Unavailable when too many renders run (the client may retry);
  // InvalidArgument "chat template: ..." when the render fails (also at a render limit); the
  // tokenizer's for text it cannot encode. `extra_vars` (a dict, or undefined) adds template
  // variables, e.g. `tools` (ChatTemplate::Render).
  absl::StatusOr<std::vector<uint32_t>> EncodeChat(const std::vector<chat::ChatMessage>& messages,
                                                   bool add_generation_prompt,
                                                   const chat::Value& extra_vars = {}) const;

  // The chat template, or null when the model has none.
  const chat::ChatTemplate* chat_template() const { return chat_template_.get(); }

 private:
  const engine::ModelFront* const model_;
  const std::unique_ptr<chat::ChatTemplate> chat_template_;
};

}  // namespace pd::router
