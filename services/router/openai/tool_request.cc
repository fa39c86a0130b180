#include "services/router/openai/tool_request.h"

#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "services/router/openai/openai_request.h"

namespace pd::router::openai {
namespace {

using ordered_json = nlohmann::ordered_json;
using json = nlohmann::json;

absl::Status Bad(absl::string_view param, absl::string_view message) {
  return WithParam(absl::InvalidArgumentError(absl::StrCat(param, ": ", message)), param);
}

bool ValidName(absl::string_view name) {
  if (name.empty() || name.size() > kMaxToolNameBytes) return false;
  for (const char c : name) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '_' || c == '-';
    if (!ok) return false;
  }
  return true;
}

absl::StatusOr<std::string> Name(const std::string& param, const ordered_json* v) {
  if (v == nullptr || !v->is_string()) return Bad(param, "is required and must be a string");
  const std::string name = v->get<std::string>();
  if (!ValidName(name)) {
    return Bad(param,
               absl::StrCat("must match ^[a-zA-Z0-9_-]{1,64}$, got \"", name.substr(0, 80), "\""));
  }
  return name;
}

const ordered_json* Find(const ordered_json& o, const char* key) {
  auto it = o.find(key);
  return it == o.end() ? nullptr : &*it;
}

absl::StatusOr<ToolFunction> ParseFunction(const std::string& fparam, const ordered_json* f);

absl::StatusOr<ToolFunction> ParseTool(size_t i, const ordered_json& t) {
  const std::string param = absl::StrCat("tools[", i, "]");
  if (!t.is_object()) return Bad(param, "must be an object");
  const ordered_json* type = Find(t, "type");
  if (type == nullptr || !type->is_string()) {
    return Bad(absl::StrCat(param, ".type"), "is required: \"function\"");
  }
  if (type->get<std::string>() != "function") {
    return Bad(absl::StrCat(param, ".type"),
               absl::StrCat("tools of type \"", type->get<std::string>().substr(0, 64),
                            "\" are not supported; only \"function\""));
  }
  for (const auto& [key, value] : t.items()) {
    if (key != "type" && key != "function") {
      return Bad(absl::StrCat(param, ".", key), "unrecognized field");
    }
  }
  return ParseFunction(absl::StrCat(param, ".function"), Find(t, "function"));
}

// A function object {"name", "description"?, "strict"?, "parameters"?}: a tool's `function`,
// or an entry of the legacy `functions` (`fparam` names it in errors).
absl::StatusOr<ToolFunction> ParseFunction(const std::string& fparam, const ordered_json* f) {
  if (f == nullptr || !f->is_object()) return Bad(fparam, "is required and must be an object");
  ToolFunction out;
  for (const auto& [key, value] : f->items()) {
    const std::string field = absl::StrCat(fparam, ".", key);
    if (key == "name") {
      continue;
    } else if (key == "description") {
      if (!value.is_string() && !value.is_null()) return Bad(field, "must be a string");
    } else if (key == "strict") {
      // Enforced calls are always strict; "auto" calls are parsed, never enforced.
      if (!value.is_boolean() && !value.is_null()) return Bad(field, "must be a boolean");
    } else if (key == "parameters") {
      if (value.is_null()) continue;
      if (!value.is_object()) return Bad(field, "must be a JSON Schema object");
      out.parameters = value.dump();
    } else {
      return Bad(field, "unrecognized field");
    }
  }
  absl::StatusOr<std::string> name = Name(absl::StrCat(fparam, ".name"), Find(*f, "name"));
  if (!name.ok()) return name.status();
  out.name = *std::move(name);
  return out;
}

// tool_choice: "none" | "auto" | "required" | {"type": "function", "function": {"name": ...}}.
absl::Status ParseChoice(const ordered_json& v, ToolsSpec* spec) {
  if (v.is_string()) {
    const std::string s = v.get<std::string>();
    if (s == "none") {
      spec->choice = ToolChoice::kNone;
    } else if (s == "auto") {
      spec->choice = ToolChoice::kAuto;
    } else if (s == "required") {
      spec->choice = ToolChoice::kRequired;
    } else {
      return Bad("tool_choice", absl::StrCat("must be \"none\", \"auto\", \"required\" or an "
                                             "object naming a function, got \"",
                                             s.substr(0, 64), "\""));
    }
    return absl::OkStatus();
  }
  if (!v.is_object()) {
    return Bad("tool_choice", "must be a string or {\"type\": \"function\", \"function\": ...}");
  }
  for (const auto& [key, value] : v.items()) {
    if (key != "type" && key != "function") {
      return Bad(absl::StrCat("tool_choice.", key), "unrecognized field");
    }
  }
  const ordered_json* type = Find(v, "type");
  if (type == nullptr || !type->is_string() || type->get<std::string>() != "function") {
    return Bad("tool_choice.type", "must be \"function\"");
  }
  const ordered_json* f = Find(v, "function");
  if (f == nullptr || !f->is_object()) {
    return Bad("tool_choice.function", "is required: {\"name\": ...}");
  }
  for (const auto& [key, value] : f->items()) {
    if (key != "name") return Bad(absl::StrCat("tool_choice.function.", key), "unrecognized field");
  }
  absl::StatusOr<std::string> name = Name("tool_choice.function.name", Find(*f, "name"));
  if (!name.ok()) return name.status();
  spec->choice = ToolChoice::kFunction;
  spec->function = *std::move(name);
  return absl::OkStatus();
}

// One call object of an enforced call's schema.
ordered_json CallSchema(const ToolFunction& f) {
  ordered_json args = f.parameters.empty()
                          ? ordered_json{{"type", "object"}, {"additionalProperties", false}}
                          : ordered_json::parse(f.parameters);
  ordered_json s = ordered_json::object();
  s["type"] = "object";
  s["properties"] = ordered_json::object();
  s["properties"]["name"] = {{"const", f.name}};
  s["properties"]["arguments"] = std::move(args);
  s["required"] = {"name", "arguments"};
  s["additionalProperties"] = false;
  return s;
}

}  // namespace

std::vector<std::string> ToolsSpec::CallableNames() const {
  std::vector<std::string> names;
  if (choice == ToolChoice::kFunction) {
    names.push_back(function);
    return names;
  }
  for (const ToolFunction& f : functions) names.push_back(f.name);
  return names;
}

// A choice other than "none" needs functions, and a named one must be among them. `param` /
// `name_param` name the choice and its name in errors; `what` / `list` the offered kind.
absl::Status CheckChoiceOffered(const ToolsSpec& spec, absl::string_view param,
                                absl::string_view name_param, absl::string_view what,
                                absl::string_view list) {
  if (spec.choice != ToolChoice::kNone && spec.functions.empty()) {
    return Bad(param, absl::StrCat("needs ", list, ": no function is offered"));
  }
  if (spec.choice != ToolChoice::kFunction) return absl::OkStatus();
  for (const ToolFunction& f : spec.functions) {
    if (f.name == spec.function) return absl::OkStatus();
  }
  return Bad(name_param,
             absl::StrCat("no ", what, " named \"", spec.function, "\" is offered in ", list));
}

// The legacy `functions` / `function_call` (OpenAI's API before tools): read into the same
// spec, with `legacy` set (the answer is a `function_call`, one at most).
absl::StatusOr<ToolsSpec> ParseLegacyFunctions(const ordered_json* functions,
                                               const ordered_json* function_call) {
  ToolsSpec spec;
  spec.legacy = true;
  spec.parallel_tool_calls = false;
  if (functions != nullptr && !functions->is_null()) {
    if (!functions->is_array()) return Bad("functions", "must be an array");
    if (functions->size() > kMaxTools) {
      return Bad("functions",
                 absl::StrCat("at most ", kMaxTools, " functions, got ", functions->size()));
    }
    absl::flat_hash_set<std::string> names;
    ordered_json tools = ordered_json::array();
    for (size_t i = 0; i < functions->size(); ++i) {
      const std::string param = absl::StrCat("functions[", i, "]");
      absl::StatusOr<ToolFunction> f = ParseFunction(param, &(*functions)[i]);
      if (!f.ok()) return f.status();
      if (!names.insert(f->name).second) {
        return Bad(absl::StrCat(param, ".name"),
                   absl::StrCat("duplicate function name \"", f->name, "\""));
      }
      spec.functions.push_back(*std::move(f));
      // The chat template sees them as tools, as for the current API.
      tools.push_back(ordered_json{{"type", "function"}, {"function", (*functions)[i]}});
    }
    if (!tools.empty()) spec.tools_json = tools.dump();
  }
  spec.choice = spec.functions.empty() ? ToolChoice::kNone : ToolChoice::kAuto;
  if (function_call == nullptr || function_call->is_null()) return spec;
  if (function_call->is_string()) {
    const std::string s = function_call->get<std::string>();
    if (s == "none") {
      spec.choice = ToolChoice::kNone;
    } else if (s == "auto") {
      spec.choice = ToolChoice::kAuto;
    } else {
      return Bad("function_call", absl::StrCat("must be \"none\", \"auto\" or {\"name\": ...}, "
                                               "got \"",
                                               s.substr(0, 64), "\""));
    }
  } else if (function_call->is_object()) {
    for (const auto& [key, value] : function_call->items()) {
      if (key != "name") return Bad(absl::StrCat("function_call.", key), "unrecognized field");
    }
    absl::StatusOr<std::string> name = Name("function_call.name", Find(*function_call, "name"));
    if (!name.ok()) return name.status();
    spec.choice = ToolChoice::kFunction;
    spec.function = *std::move(name);
  } else {
    return Bad("function_call", "must be \"none\", \"auto\" or {\"name\": ...}");
  }
  if (absl::Status s = CheckChoiceOffered(spec, "function_call", "function_call.name", "function",
                                          "functions");
      !s.ok()) {
    return s;
  }
  return spec;
}

absl::StatusOr<ToolsSpec> ParseTools(const ordered_json& body) {
  ToolsSpec spec;
  const ordered_json* functions = Find(body, "functions");
  const ordered_json* function_call = Find(body, "function_call");
  // Their no-op values (null, [], "none") are accepted beside tools, as before.
  const bool legacy =
      (functions != nullptr && !functions->is_null() &&
       !(functions->is_array() && functions->empty())) ||
      (function_call != nullptr && !function_call->is_null() &&
       !(function_call->is_string() && function_call->get<std::string>() == "none"));
  if (legacy) {
    for (const char* current : {"tools", "tool_choice"}) {
      const ordered_json* v = Find(body, current);
      if (v != nullptr && !v->is_null()) {
        return Bad(current, "cannot be combined with the legacy functions / function_call");
      }
    }
    return ParseLegacyFunctions(functions, function_call);
  }
  const ordered_json* tools = Find(body, "tools");
  if (tools != nullptr && !tools->is_null()) {
    if (!tools->is_array()) return Bad("tools", "must be an array");
    if (tools->size() > kMaxTools) {
      return Bad("tools", absl::StrCat("at most ", kMaxTools, " tools, got ", tools->size()));
    }
    absl::flat_hash_set<std::string> names;
    for (size_t i = 0; i < tools->size(); ++i) {
      absl::StatusOr<ToolFunction> f = ParseTool(i, (*tools)[i]);
      if (!f.ok()) return f.status();
      if (!names.insert(f->name).second) {
        return Bad(absl::StrCat("tools[", i, "].function.name"),
                   absl::StrCat("duplicate function name \"", f->name, "\""));
      }
      spec.functions.push_back(*std::move(f));
    }
    if (!tools->empty()) spec.tools_json = tools->dump();
  }
  spec.choice = spec.functions.empty() ? ToolChoice::kNone : ToolChoice::kAuto;
  const ordered_json* choice = Find(body, "tool_choice");
  if (choice != nullptr && !choice->is_null()) {
    if (absl::Status s = ParseChoice(*choice, &spec); !s.ok()) return s;
    if (absl::Status s = CheckChoiceOffered(spec, "tool_choice", "tool_choice.function.name",
                                            "tool", "tools");
        !s.ok()) {
      return s;
    }
  }
  const ordered_json* parallel = Find(body, "parallel_tool_calls");
  if (parallel != nullptr && !parallel->is_null()) {
    if (!parallel->is_boolean()) return Bad("parallel_tool_calls", "must be a boolean");
    spec.parallel_tool_calls = parallel->get<bool>();
    spec.parallel_tool_calls_set = true;
  }
  return spec;
}

std::string EnforcedCallSchema(const ToolsSpec& spec) {
  std::vector<ordered_json> calls;
  for (const ToolFunction& f : spec.functions) {
    if (spec.choice == ToolChoice::kFunction && f.name != spec.function) continue;
    calls.push_back(CallSchema(f));
  }
  ordered_json call;
  if (calls.size() == 1) {
    call = std::move(calls[0]);
  } else {
    call = ordered_json::object();
    call["anyOf"] = ordered_json(std::move(calls));
  }
  if (!spec.enforced_list()) return call.dump();
  ordered_json list = ordered_json::object();
  list["type"] = "array";
  list["items"] = std::move(call);
  list["minItems"] = 1;
  return list.dump();
}

namespace {

// Mistral's tags (AutoCallTag): v3's list of calls at the start, v11's named calls anywhere.
std::string MistralCallTag(const ToolsSpec& spec, const CallTagVariant& variant) {
  constexpr absl::string_view kCalls = "[TOOL_CALLS]";
  constexpr absl::string_view kArgs = "[ARGS]";
  ordered_json tag = ordered_json::object();
  tag["type"] = "structural_tag";
  ordered_json structures = ordered_json::array();
  if (variant.mistral_named) {
    for (const ToolFunction& f : spec.functions) {
      ordered_json st = ordered_json::object();
      st["begin"] = absl::StrCat(kCalls, f.name, kArgs);
      st["end"] = "";
      st["schema"] = f.parameters.empty()
                         ? ordered_json{{"type", "object"}, {"additionalProperties", false}}
                         : ordered_json::parse(f.parameters);
      structures.push_back(std::move(st));
    }
  } else {
    std::vector<ordered_json> calls;
    for (const ToolFunction& f : spec.functions) calls.push_back(CallSchema(f));
    ordered_json list = ordered_json::object();
    list["type"] = "array";
    if (calls.size() == 1) {
      list["items"] = std::move(calls[0]);
    } else {
      list["items"] = ordered_json::object();
      list["items"]["anyOf"] = ordered_json(std::move(calls));
    }
    list["minItems"] = 1;
    if (spec.parallel_tool_calls_set && !spec.parallel_tool_calls) list["maxItems"] = 1;
    ordered_json st = ordered_json::object();
    st["begin"] = kCalls;
    st["schema"] = std::move(list);
    st["end"] = "";
    structures.push_back(std::move(st));
    // (v3's call is the whole output, as the template writes it: `[TOOL_CALLS][...]</s>`.)
    tag["at_start"] = true;
  }
  tag["structures"] = std::move(structures);
  tag["triggers"] = {kCalls};
  if (variant.mistral_special) {
    tag["special_tokens"] = ordered_json::array();
    tag["special_tokens"].push_back(kCalls);
    if (variant.mistral_named) tag["special_tokens"].push_back(kArgs);
  }
  return tag.dump();
}

}  // namespace

std::string AutoCallTag(const ToolsSpec& spec, ToolCallFormat format,
                        const CallTagVariant& variant) {
  if (format == ToolCallFormat::kMistral) return MistralCallTag(spec, variant);
  const bool fenced = variant.fenced;
  const bool deepseek = format == ToolCallFormat::kDeepseek;
  const bool llama = format == ToolCallFormat::kLlama3;
  ordered_json structures = ordered_json::array();
  for (const ToolFunction& f : spec.functions) {
    ordered_json st = ordered_json::object();
    if (llama) {
      st["begin"] = absl::StrCat("{\"name\": \"", f.name, "\", \"parameters\": ");
      st["end"] = "}";
    } else if (!deepseek) {
      st["begin"] = absl::StrCat(kHermesCallOpen, "\n{\"name\": \"", f.name, "\", \"arguments\": ");
      st["end"] = absl::StrCat("}\n", kHermesCallClose);
    } else if (fenced) {
      st["begin"] = absl::StrCat(kDeepseekCallsOpen, kDeepseekCallBegin, "function", kDeepseekSep,
                                 f.name, "\n```json\n");
      st["end"] = absl::StrCat("\n```", kDeepseekCallEnd, kDeepseekCallsClose);
    } else {
      st["begin"] = absl::StrCat(kDeepseekCallsOpen, kDeepseekCallBegin, f.name, kDeepseekSep);
      st["end"] = absl::StrCat(kDeepseekCallEnd, kDeepseekCallsClose);
    }
    st["schema"] = f.parameters.empty()
                       ? ordered_json{{"type", "object"}, {"additionalProperties", false}}
                       : ordered_json::parse(f.parameters);
    structures.push_back(std::move(st));
  }
  ordered_json tag = ordered_json::object();
  tag["type"] = "structural_tag";
  tag["structures"] = std::move(structures);
  tag["triggers"] = {llama ? "{" : deepseek ? kDeepseekCallsOpen : kHermesCallOpen};
  // (Llama 3's call is the whole output: `{` starts one only at the start.)
  if (llama) tag["at_start"] = true;
  return tag.dump();
}

absl::StatusOr<std::string> ParseHistoryToolCalls(absl::string_view param, const json& v) {
  if (!v.is_array()) return Bad(param, "must be an array of tool calls");
  ordered_json out = ordered_json::array();
  for (size_t i = 0; i < v.size(); ++i) {
    const std::string p = absl::StrCat(param, "[", i, "]");
    const json& c = v[i];
    if (!c.is_object()) return Bad(p, "must be an object");
    ordered_json call = ordered_json::object();
    for (const auto& [key, value] : c.items()) {
      if (key != "id" && key != "type" && key != "function") {
        return Bad(absl::StrCat(p, ".", key), "unrecognized field");
      }
    }
    auto id = c.find("id");
    if (id == c.end() || !id->is_string()) {
      return Bad(absl::StrCat(p, ".id"), "is required and must be a string");
    }
    auto type = c.find("type");
    if (type != c.end() && !(type->is_string() && type->get<std::string>() == "function")) {
      return Bad(absl::StrCat(p, ".type"), "must be \"function\"");
    }
    auto f = c.find("function");
    if (f == c.end() || !f->is_object()) {
      return Bad(absl::StrCat(p, ".function"), "is required and must be an object");
    }
    for (const auto& [key, value] : f->items()) {
      if (key != "name" && key != "arguments") {
        return Bad(absl::StrCat(p, ".function.", key), "unrecognized field");
      }
    }
    auto name = f->find("name");
    if (name == f->end() || !name->is_string()) {
      return Bad(absl::StrCat(p, ".function.name"), "is required and must be a string");
    }
    auto args = f->find("arguments");
    if (args == f->end() || !args->is_string()) {
      return Bad(absl::StrCat(p, ".function.arguments"),
                 "is required and must be a string (the arguments as JSON text)");
    }
    const std::string& text = args->get_ref<const std::string&>();
    ordered_json parsed = ordered_json::parse(text, nullptr, /*allow_exceptions=*/false);
    call["id"] = id->get<std::string>();
    call["type"] = "function";
    call["function"] = ordered_json::object();
    call["function"]["name"] = name->get<std::string>();
    // Templates write arguments with `| tojson` (Qwen, Llama 3.1) or iterate them as a mapping:
    // both expect an object, as Hugging Face and vLLM give them.
    call["function"]["arguments"] = parsed.is_object() ? std::move(parsed) : ordered_json(text);
    out.push_back(std::move(call));
  }
  return out.dump(-1, ' ', false, ordered_json::error_handler_t::replace);
}

}  // namespace pd::router::openai
