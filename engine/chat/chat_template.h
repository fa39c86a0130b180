// ChatTemplate: a model's chat template (Jinja2, engine/chat/jinja.h) turned into the prompt
// text for a list of chat messages, as Hugging Face's apply_chat_template(tokenize=False) does:
// the template is parsed with trim_blocks and lstrip_blocks and rendered with `messages`,
// `add_generation_prompt`, `bos_token`, `eos_token` and any extra variables (tools,
// documents, ...), with `raise_exception` and `strftime_now` available.
//
// Every render is bounded (ChatTemplateLimits: time, memory, iterations, output), and so is the
// number of renders running at once, so that a hostile template (a downloaded model's
// tokenizer_config.json is not trusted) costs a bounded share of the process.
//
// Thread-safety: immutable after creation apart from the count of renders in flight; Render
// may be called from several threads.
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "engine/chat/jinja.h"
#include "engine/chat/value.h"

namespace pd::chat {

// One chat message. `content` is text: callers flatten OpenAI-style content parts first.
// `fields`, when a dict, adds keys to the message's dict as the template sees it, or replaces
// role/content: tool_calls, tool_call_id and name of tool calling, and content None for an
// assistant turn that only calls tools (as Hugging Face passes OpenAI messages).
struct ChatMessage {
  std::string role;
  std::string content;
  // The client sent no content (null: an assistant's tool calls). Templates that test
  // `content is none` (DeepSeek's) see None; the others "", as vLLM gives it.
  bool content_none = false;
  // Other keys the template sees (tool_calls, tool_call_id, name).
  Value fields = Value();
  // Per call of `tool_calls`, the client's arguments text: templates that write arguments as
  // a string (DeepSeek's) get it in place of the parsed object (empty: keep what is there).
  std::vector<std::string> call_arguments;
};

struct ChatTemplateLimits {
  // Bounds of each render (engine/chat/jinja.h).
  RenderLimits render;
  // Renders of one template running at once; one more fails at once with Unavailable (the
  // HTTP API answers 503: retry). With max_memory_bytes this bounds the memory renders take.
  int max_in_flight = 8;

  // InvalidArgument naming the first bad limit.
  absl::Status Validate() const;
};

class ChatTemplate {
 public:
  // Parses `source`. InvalidArgument (with line and column) for a syntax error.
  static absl::StatusOr<ChatTemplate> Create(std::string source, std::string bos_token,
                                             std::string eos_token,
                                             const ChatTemplateLimits& limits = {});

  // Reads the template and the bos/eos tokens from a Hugging Face tokenizer_config.json (the
  // text of the file; `name` is used in messages). `chat_template` may be a string or a list
  // of {name, template} objects, of which "default" is taken; bos_token/eos_token may be a
  // string, an {"content": ...} object or absent/null (""). Errors: InvalidArgument for
  // malformed JSON, wrong field types or a template that does not parse; NotFound when there
  // is no chat_template (or no "default" among named ones).
  static absl::StatusOr<ChatTemplate> FromTokenizerConfigJson(
      absl::string_view json, absl::string_view name, const ChatTemplateLimits& limits = {});

  // Reads `<model_dir>/tokenizer_config.json`; when it has no chat_template, the template is
  // read from `<model_dir>/chat_template.jinja` (where newer transformers save it). Errors as
  // FromTokenizerConfigJson, plus those of reading the files (NotFound when missing).
  static absl::StatusOr<ChatTemplate> FromModelDir(absl::string_view model_dir,
                                                   const ChatTemplateLimits& limits = {});

  // The prompt for `messages`. `extra_vars`, when a dict, adds variables (or overrides the
  // standard ones). Errors: InvalidArgument when the template fails (raise_exception's message
  // verbatim, or the evaluation error with its line); ResourceExhausted naming the render
  // limit that tripped; Unavailable when max_in_flight renders are running already.
  absl::StatusOr<std::string> Render(const std::vector<ChatMessage>& messages,
                                     bool add_generation_prompt,
                                     const Value& extra_vars = Value()) const;

  // Renders a small sample conversation (user, assistant, user; generation prompt on) once, to
  // refuse a pathological template when it is loaded rather than on every request:
  // ResourceExhausted ("the template exceeds its limits on a 3-message sample conversation:
  // ...") when a limit trips. A template that rejects the sample by design (raise_exception,
  // an error in its own checks) is not refused: that is OK here, as the request decides.
  absl::Status CheckRendersSample() const;

  // Takes one of the max_in_flight render slots until the returned object is destroyed, as a
  // running Render does (Unavailable when none is free).
  absl::StatusOr<std::shared_ptr<void>> HoldRenderSlotForTest() const { return TakeSlot(); }

  const std::string& source() const { return source_; }
  const std::string& bos_token() const { return bos_token_; }
  const std::string& eos_token() const { return eos_token_; }
  // The template tests `content is none` (a call-only turn's null content reaches it as None)
  // and writes call arguments with `+` (as the client's text, not an object).
  bool none_call_content() const { return none_call_content_; }
  bool text_call_arguments() const { return text_call_arguments_; }

 private:
  // A render slot, released when the returned object is destroyed; Unavailable when all
  // max_in_flight are taken.
  absl::StatusOr<std::shared_ptr<void>> TakeSlot() const;

  ChatTemplate(Template tmpl, std::string source, std::string bos_token, std::string eos_token,
               const ChatTemplateLimits& limits)
      : template_(std::move(tmpl)),
        source_(std::move(source)),
        bos_token_(std::move(bos_token)),
        eos_token_(std::move(eos_token)),
        limits_(limits),
        in_flight_(std::make_shared<std::atomic<int>>(0)) {
    ReadCallConventions();
  }
  // How the template reads an assistant's tool calls (DeepSeek's tests `content is none` and
  // writes `arguments` with `+`, as a string), from its source.
  void ReadCallConventions();

  Template template_;
  std::string source_;
  std::string bos_token_;
  std::string eos_token_;
  ChatTemplateLimits limits_;
  // A call-only assistant turn's content reaches the template as None (else "").
  bool none_call_content_ = false;
  // Call arguments reach the template as the client's JSON text (else parsed into an object).
  bool text_call_arguments_ = false;
  // Renders running now, shared by copies of this template.
  std::shared_ptr<std::atomic<int>> in_flight_;
};

}  // namespace pd::chat
