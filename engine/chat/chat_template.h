// ChatTemplate: a model's chat template (Jinja2, engine/chat/jinja.h) turned into the prompt
// text for a list of chat messages, as Hugging Face's apply_chat_template(tokenize=False) does:
// the template is parsed with trim_blocks and lstrip_blocks and rendered with `messages`,
// `add_generation_prompt`, `bos_token`, `eos_token` and any extra variables (tools,
// documents, ...), with `raise_exception` and `strftime_now` available.
//
// Thread-safety: immutable after creation; Render may be called from several threads.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "engine/chat/jinja.h"
#include "engine/chat/value.h"

namespace pd::chat {

// One chat message. `content` is text: callers flatten OpenAI-style content parts first.
struct ChatMessage {
  std::string role;
  std::string content;
};

class ChatTemplate {
 public:
  // Parses `source`. InvalidArgument (with line and column) for a syntax error.
  static absl::StatusOr<ChatTemplate> Create(std::string source, std::string bos_token,
                                             std::string eos_token,
                                             const RenderLimits& limits = {});

  // Reads the template and the bos/eos tokens from a Hugging Face tokenizer_config.json (the
  // text of the file; `name` is used in messages). `chat_template` may be a string or a list
  // of {name, template} objects, of which "default" is taken; bos_token/eos_token may be a
  // string, an {"content": ...} object or absent/null (""). Errors: InvalidArgument for
  // malformed JSON, wrong field types or a template that does not parse; NotFound when there
  // is no chat_template (or no "default" among named ones).
  static absl::StatusOr<ChatTemplate> FromTokenizerConfigJson(absl::string_view json,
                                                              absl::string_view name,
                                                              const RenderLimits& limits = {});

  // Reads `<model_dir>/tokenizer_config.json`; when it has no chat_template, the template is
  // read from `<model_dir>/chat_template.jinja` (where newer transformers save it). Errors as
  // FromTokenizerConfigJson, plus those of reading the files (NotFound when missing).
  static absl::StatusOr<ChatTemplate> FromModelDir(absl::string_view model_dir,
                                                   const RenderLimits& limits = {});

  // The prompt for `messages`. `extra_vars`, when a dict, adds variables (or overrides the
  // standard ones). Errors: InvalidArgument when the template fails (raise_exception's message
  // verbatim, or the evaluation error with its line); ResourceExhausted past the limits.
  absl::StatusOr<std::string> Render(const std::vector<ChatMessage>& messages,
                                     bool add_generation_prompt,
                                     const Value& extra_vars = Value()) const;

  const std::string& source() const { return source_; }
  const std::string& bos_token() const { return bos_token_; }
  const std::string& eos_token() const { return eos_token_; }

 private:
  ChatTemplate(Template tmpl, std::string source, std::string bos_token, std::string eos_token,
               const RenderLimits& limits)
      : template_(std::move(tmpl)),
        source_(std::move(source)),
        bos_token_(std::move(bos_token)),
        eos_token_(std::move(eos_token)),
        limits_(limits) {}

  Template template_;
  std::string source_;
  std::string bos_token_;
  std::string eos_token_;
  RenderLimits limits_;
};

}  // namespace pd::chat
