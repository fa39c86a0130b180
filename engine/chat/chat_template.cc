#include "engine/chat/chat_template.h"

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "engine/model/mapped_file.h"

namespace pd::chat {
namespace {

// A special token as tokenizer_config.json writes it: a string, an AddedToken object
// ({"content": "<s>", ...}) or null/absent.
absl::StatusOr<std::string> SpecialToken(const Value& config, absl::string_view field,
                                         absl::string_view name) {
  const Value* v = config.dict().Find(field);
  if (v == nullptr || v->is_none()) {
    return std::string();
  }
  if (v->is_string()) {
    return v->str();
  }
  if (v->is_dict()) {
    const Value* content = v->dict().Find("content");
    if (content != nullptr && content->is_string()) {
      return content->str();
    }
  }
  return absl::InvalidArgumentError(absl::StrCat(
      name, ": \"", field, "\" must be a string or an object with a string \"content\""));
}

// The chat_template field: a string, or [{"name": ..., "template": ...}] (take "default").
// Sets *found to false when the field is absent or null.
absl::StatusOr<std::string> TemplateField(const Value& config, absl::string_view name,
                                          bool* found) {
  *found = false;
  const Value* v = config.dict().Find("chat_template");
  if (v == nullptr || v->is_none()) {
    return std::string();
  }
  if (v->is_string()) {
    *found = true;
    return v->str();
  }
  if (!v->is_list()) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": \"chat_template\" must be a string or a list of templates"));
  }
  std::string names;
  for (const Value& entry : v->list()) {
    const Value* n = entry.is_dict() ? entry.dict().Find("name") : nullptr;
    const Value* t = entry.is_dict() ? entry.dict().Find("template") : nullptr;
    if (n == nullptr || t == nullptr || !n->is_string() || !t->is_string()) {
      return absl::InvalidArgumentError(absl::StrCat(
          name, ": each \"chat_template\" entry needs string \"name\" and \"template\""));
    }
    if (n->str() == "default") {
      *found = true;
      return t->str();
    }
    absl::StrAppend(&names, names.empty() ? "" : ", ", n->str());
  }
  return absl::NotFoundError(absl::StrCat(
      name, ": \"chat_template\" has no template named \"default\" (has: ", names, ")"));
}

}  // namespace

absl::Status ChatTemplateLimits::Validate() const {
  PD_RETURN_IF_ERROR(render.Validate());
  if (max_in_flight <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("chat template max_in_flight must be positive, got ", max_in_flight));
  }
  return absl::OkStatus();
}

absl::StatusOr<ChatTemplate> ChatTemplate::Create(std::string source, std::string bos_token,
                                                  std::string eos_token,
                                                  const ChatTemplateLimits& limits) {
  PD_RETURN_IF_ERROR(limits.Validate());
  TemplateOptions options;
  options.trim_blocks = true;
  options.lstrip_blocks = true;
  absl::StatusOr<Template> tmpl = Template::Parse(source, options);
  if (!tmpl.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("chat template: ", tmpl.status().message()));
  }
  return ChatTemplate(*std::move(tmpl), std::move(source), std::move(bos_token),
                      std::move(eos_token), limits);
}

absl::StatusOr<ChatTemplate> ChatTemplate::FromTokenizerConfigJson(
    absl::string_view json, absl::string_view name, const ChatTemplateLimits& limits) {
  absl::StatusOr<Value> config = ParseJsonValue(json);
  if (!config.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": ", config.status().message()));
  }
  if (!config->is_dict()) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": not a JSON object"));
  }
  bool found = false;
  PD_ASSIGN_OR_RETURN(std::string source, TemplateField(*config, name, &found));
  if (!found) {
    return absl::NotFoundError(absl::StrCat(name, " has no \"chat_template\""));
  }
  PD_ASSIGN_OR_RETURN(std::string bos, SpecialToken(*config, "bos_token", name));
  PD_ASSIGN_OR_RETURN(std::string eos, SpecialToken(*config, "eos_token", name));
  return Create(std::move(source), std::move(bos), std::move(eos), limits);
}

absl::StatusOr<ChatTemplate> ChatTemplate::FromModelDir(absl::string_view model_dir,
                                                        const ChatTemplateLimits& limits) {
  const std::string config_path = absl::StrCat(model_dir, "/tokenizer_config.json");
  PD_ASSIGN_OR_RETURN(engine::MappedFile config, engine::MappedFile::Open(config_path));
  absl::StatusOr<ChatTemplate> t = FromTokenizerConfigJson(config.contents(), config_path, limits);
  if (!absl::IsNotFound(t.status())) {
    return t;
  }
  // Newer transformers save the template beside the config, in chat_template.jinja.
  const std::string jinja_path = absl::StrCat(model_dir, "/chat_template.jinja");
  absl::StatusOr<engine::MappedFile> jinja = engine::MappedFile::Open(jinja_path);
  if (!jinja.ok()) {
    if (absl::IsNotFound(jinja.status())) {
      return absl::NotFoundError(
          absl::StrCat(config_path, " has no \"chat_template\" and there is no ", jinja_path));
    }
    return jinja.status();
  }
  // Take bos/eos from the config: a template-less config still names them.
  PD_ASSIGN_OR_RETURN(Value parsed, ParseJsonValue(config.contents()));
  if (!parsed.is_dict()) {
    return absl::InvalidArgumentError(absl::StrCat(config_path, ": not a JSON object"));
  }
  PD_ASSIGN_OR_RETURN(std::string bos, SpecialToken(parsed, "bos_token", config_path));
  PD_ASSIGN_OR_RETURN(std::string eos, SpecialToken(parsed, "eos_token", config_path));
  return Create(std::string(jinja->contents()), std::move(bos), std::move(eos), limits);
}

namespace {

// Whether `source` has the name `word`, then optionally a closing quote and bracket
// (`['word']`), such that `rest` accepts (a predicate on the text before the name and the
// text after it).
template <typename Rest>
bool HasAccess(absl::string_view source, absl::string_view word, Rest rest) {
  for (size_t at = source.find(word); at != absl::string_view::npos;
       at = source.find(word, at + 1)) {
    // (A whole name: `reasoning_content` is not `content`.)
    if (at > 0 && (absl::ascii_isalnum(static_cast<unsigned char>(source[at - 1])) ||
                   source[at - 1] == '_')) {
      continue;
    }
    absl::string_view tail = source.substr(at + word.size());
    if (!tail.empty() && (tail[0] == '\'' || tail[0] == '"')) tail.remove_prefix(1);
    if (!tail.empty() && tail[0] == ']') tail.remove_prefix(1);
    if (rest(source.substr(0, at), tail)) return true;
  }
  return false;
}

absl::string_view SkipSpaces(absl::string_view s) {
  while (!s.empty() && absl::ascii_isspace(static_cast<unsigned char>(s[0]))) s.remove_prefix(1);
  return s;
}

// A message's tool calls as a template that writes arguments as a string reads them: each
// call's function.arguments replaced by the client's text.
Value CallsWithArgumentText(const Value& calls, const std::vector<std::string>& texts) {
  if (!calls.is_list()) return calls;
  ValueList out;
  out.reserve(calls.list().size());
  for (size_t i = 0; i < calls.list().size(); ++i) {
    const Value& call = calls.list()[i];
    const Value* function = call.is_dict() ? call.dict().Find("function") : nullptr;
    if (i >= texts.size() || function == nullptr || !function->is_dict()) {
      out.push_back(call);
      continue;
    }
    Dict f = function->dict();
    f.Set(Value::String("arguments"), Value::String(texts[i]));
    Dict d = call.dict();
    d.Set(Value::String("function"), Value::MakeDict(std::move(f)));
    out.push_back(Value::MakeDict(std::move(d)));
  }
  return Value::List(std::move(out));
}

}  // namespace

void ChatTemplate::ReadCallConventions() {
  // DeepSeek-V3's template: `{%- if message['role'] == 'assistant' and message['content'] is
  // none %}` finds a call-only turn (a "" would drop the calls from the prompt), and
  // `'\n' + tool['function']['arguments'] + '\n'` writes the arguments (an object would fail).
  // Other templates test `'</think>' in content` (Qwen3: None fails) or write `arguments |
  // tojson` (an object), as vLLM and Hugging Face give them.
  none_call_content_ = HasAccess(source_, "content", [](absl::string_view, absl::string_view tail) {
    const absl::string_view rest = SkipSpaces(tail);
    if (rest.size() == tail.size() || !absl::StartsWith(rest, "is")) return false;
    absl::string_view after = SkipSpaces(rest.substr(2));
    if (absl::StartsWith(after, "not ")) after = SkipSpaces(after.substr(3));
    return absl::StartsWith(after, "none");
  });
  // `... + tool['function']['arguments']` or `tool.function.arguments + ...`.
  text_call_arguments_ =
      HasAccess(source_, "arguments", [](absl::string_view before, absl::string_view tail) {
        if (absl::StartsWith(SkipSpaces(tail), "+")) return true;
        // Back over the accessor chain (tool['function'][', tool.function.), then spaces.
        while (!before.empty()) {
          const char c = before.back();
          if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '_' && c != '.' &&
              c != '[' && c != ']' && c != '\'' && c != '"') {
            break;
          }
          before.remove_suffix(1);
        }
        while (!before.empty() && absl::ascii_isspace(static_cast<unsigned char>(before.back()))) {
          before.remove_suffix(1);
        }
        return absl::EndsWith(before, "+");
      });
}

absl::StatusOr<std::string> ChatTemplate::Render(const std::vector<ChatMessage>& messages,
                                                 bool add_generation_prompt,
                                                 const Value& extra_vars) const {
  PD_ASSIGN_OR_RETURN(std::shared_ptr<void> slot, TakeSlot());
  ValueList list;
  list.reserve(messages.size());
  for (const ChatMessage& m : messages) {
    Dict d;
    d.Set(Value::String("role"), Value::String(m.role));
    d.Set(Value::String("content"), Value::String(m.content));
    if (m.fields.is_dict()) {
      for (const auto& [k, v] : m.fields.dict().items) {
        if (k.is_string() && k.str() == "tool_calls") {
          if (none_call_content_ && m.content_none) {
            d.Set(Value::String("content"), Value::None());
          }
          d.Set(k, text_call_arguments_ ? CallsWithArgumentText(v, m.call_arguments) : v);
          continue;
        }
        d.Set(k, v);
      }
    }
    list.push_back(Value::MakeDict(std::move(d)));
  }
  Dict context;
  context.Set(Value::String("messages"), Value::List(std::move(list)));
  context.Set(Value::String("add_generation_prompt"), Value::Bool(add_generation_prompt));
  context.Set(Value::String("bos_token"), Value::String(bos_token_));
  context.Set(Value::String("eos_token"), Value::String(eos_token_));
  if (extra_vars.is_dict()) {
    for (const auto& [k, v] : extra_vars.dict().items) {
      context.Set(k, v);
    }
  }
  return template_.Render(Value::MakeDict(std::move(context)), limits_.render);
}

absl::StatusOr<std::shared_ptr<void>> ChatTemplate::TakeSlot() const {
  // Taken or refused without waiting; relaxed: the count orders nothing else.
  if (in_flight_->fetch_add(1, std::memory_order_relaxed) >= limits_.max_in_flight) {
    in_flight_->fetch_sub(1, std::memory_order_relaxed);
    return absl::UnavailableError(absl::StrCat("chat template: ", limits_.max_in_flight,
                                               " renders are running already; retry"));
  }
  std::shared_ptr<std::atomic<int>> count = in_flight_;
  return std::shared_ptr<void>(nullptr,
                               [count](void*) { count->fetch_sub(1, std::memory_order_relaxed); });
}

absl::Status ChatTemplate::CheckRendersSample() const {
  const std::vector<ChatMessage> sample = {{"user", "Hello! Can you help me with something?"},
                                           {"assistant", "Of course. What do you need?"},
                                           {"user", "Tell me a short story about a cat."}};
  absl::StatusOr<std::string> text = Render(sample, /*add_generation_prompt=*/true);
  if (absl::IsResourceExhausted(text.status())) {
    return absl::ResourceExhaustedError(
        absl::StrCat("the chat template exceeds its limits on a 3-message sample conversation: ",
                     text.status().message()));
  }
  return absl::OkStatus();
}

}  // namespace pd::chat
