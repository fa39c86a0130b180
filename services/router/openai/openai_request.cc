#include "services/router/openai/openai_request.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <utility>

#include "absl/strings/cord.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "nlohmann/json.hpp"

namespace pd::router::openai {
namespace {

using json = nlohmann::json;

constexpr char kParamPayload[] = "type.pdserve/openai.param";

absl::Status Bad(absl::string_view param, absl::string_view message) {
  return WithParam(absl::InvalidArgumentError(absl::StrCat(param, ": ", message)), param);
}

const char* TypeName(const json& v) {
  switch (v.type()) {
    case json::value_t::null:
      return "null";
    case json::value_t::boolean:
      return "a boolean";
    case json::value_t::string:
      return "a string";
    case json::value_t::array:
      return "an array";
    case json::value_t::object:
      return "an object";
    case json::value_t::number_integer:
    case json::value_t::number_unsigned:
      return "an integer";
    case json::value_t::number_float:
      return "a number";
    default:
      return "an unsupported value";
  }
}

absl::Status WrongType(absl::string_view param, absl::string_view want, const json& v) {
  return Bad(param, absl::StrCat("must be ", want, ", got ", TypeName(v)));
}

absl::StatusOr<bool> GetBool(absl::string_view param, const json& v) {
  if (!v.is_boolean()) return WrongType(param, "a boolean", v);
  return v.get<bool>();
}

absl::StatusOr<double> GetNumber(absl::string_view param, const json& v) {
  if (!v.is_number()) return WrongType(param, "a number", v);
  const double d = v.get<double>();
  if (!std::isfinite(d)) return Bad(param, "must be finite");
  return d;
}

// An integer in [lo, hi]; an integral float (5.0) counts as an integer.
absl::StatusOr<int64_t> GetInt(absl::string_view param, const json& v, int64_t lo, int64_t hi) {
  int64_t x;
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return Bad(param, absl::StrCat("must be at most ", hi));
    }
    x = static_cast<int64_t>(u);
  } else if (v.is_number_integer()) {
    x = v.get<int64_t>();
  } else if (v.is_number_float()) {
    const double d = v.get<double>();
    if (!std::isfinite(d) || d != std::floor(d) || std::fabs(d) > 9.0e15) {
      return Bad(param, "must be an integer");
    }
    x = static_cast<int64_t>(d);
  } else {
    return WrongType(param, "an integer", v);
  }
  if (x < lo || x > hi) {
    return Bad(param, absl::StrCat("must be in [", lo, ", ", hi, "], got ", x));
  }
  return x;
}

absl::StatusOr<std::string> GetString(absl::string_view param, const json& v) {
  if (!v.is_string()) return WrongType(param, "a string", v);
  return v.get<std::string>();
}

// "stop": a string or an array of strings.
absl::Status ParseStop(const json& v, const ParseLimits& limits, pdserve::v1::SamplingParams* s) {
  std::vector<std::string> stops;
  if (v.is_string()) {
    stops.push_back(v.get<std::string>());
  } else if (v.is_array()) {
    for (size_t i = 0; i < v.size(); ++i) {
      if (!v[i].is_string()) return WrongType(absl::StrCat("stop[", i, "]"), "a string", v[i]);
      stops.push_back(v[i].get<std::string>());
    }
  } else {
    return WrongType("stop", "a string or an array of strings", v);
  }
  if (stops.size() > limits.max_stop_strings) {
    return Bad("stop", absl::StrCat("at most ", limits.max_stop_strings, " stop strings, got ",
                                    stops.size()));
  }
  for (std::string& stop : stops) {
    if (stop.empty()) return Bad("stop", "stop strings must not be empty");
    s->add_stop(std::move(stop));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<uint32_t>> ParseTokenIds(absl::string_view param, const json& v,
                                                    uint32_t max_count) {
  if (v.size() > max_count) {
    return Bad(param, absl::StrCat("at most ", max_count, " token ids, got ", v.size()));
  }
  std::vector<uint32_t> ids;
  ids.reserve(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    PD_ASSIGN_OR_RETURN(int64_t id, GetInt(absl::StrCat(param, "[", i, "]"), v[i], 0,
                                           std::numeric_limits<uint32_t>::max()));
    ids.push_back(static_cast<uint32_t>(id));
  }
  return ids;
}

// "prompt": a string, an array of token ids, or a one-element array of either. Nothing deeper:
// the form is checked level by level, never by recursion (a request nesting arrays a hundred
// thousand deep must cost a 400, not the router's stack).
absl::Status ParsePrompt(const json& v, const ParseLimits& limits, OpenAiRequest* r) {
  const json* p = &v;
  if (p->is_array() && p->size() == 1 && ((*p)[0].is_string() || (*p)[0].is_array())) {
    p = &(*p)[0];  // [prompt]: a batch of one
  } else if (p->is_array() && !p->empty() && ((*p)[0].is_string() || (*p)[0].is_array())) {
    return Bad("prompt", absl::StrCat("batches of prompts are not supported (", p->size(),
                                      " given): send one prompt per request"));
  }
  if (p->is_string()) {
    r->prompt_text = p->get<std::string>();
    return absl::OkStatus();
  }
  if (!p->is_array()) {
    return WrongType("prompt", "a string or an array of token ids", *p);
  }
  if (p->empty()) return Bad("prompt", "must not be empty");
  const std::string param = p == &v ? "prompt" : "prompt[0]";
  PD_ASSIGN_OR_RETURN(std::vector<uint32_t> ids,
                      ParseTokenIds(param, *p, limits.max_prompt_tokens));
  r->prompt_ids = std::move(ids);
  return absl::OkStatus();
}

// "metadata": as OpenAI defines it, a map of at most 16 string keys (64 characters at most) to
// string values (512 characters at most). It has no effect on the output.
absl::Status ParseMetadata(const json& v) {
  constexpr size_t kMaxPairs = 16, kMaxKey = 64, kMaxValue = 512;
  if (!v.is_object()) return WrongType("metadata", "an object of strings", v);
  if (v.size() > kMaxPairs) {
    return Bad("metadata", absl::StrCat("at most ", kMaxPairs, " keys, got ", v.size()));
  }
  for (const auto& [key, value] : v.items()) {
    if (key.size() > kMaxKey) {
      return Bad("metadata", absl::StrCat("keys are at most ", kMaxKey, " characters"));
    }
    const std::string field = absl::StrCat("metadata.", key);
    if (!value.is_string()) return WrongType(field, "a string", value);
    if (value.get_ref<const std::string&>().size() > kMaxValue) {
      return Bad(field, absl::StrCat("values are at most ", kMaxValue, " characters"));
    }
  }
  return absl::OkStatus();
}

// One message's "content": a string, null (assistant only) or an array of text parts.
absl::StatusOr<std::string> ParseContent(const std::string& param, const json& v,
                                         const std::string& role) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_null()) {
    if (role == "assistant") return std::string();
    return Bad(param, "must not be null");
  }
  if (!v.is_array()) return WrongType(param, "a string or an array of content parts", v);
  std::string text;
  for (size_t j = 0; j < v.size(); ++j) {
    const std::string part = absl::StrCat(param, "[", j, "]");
    const json& p = v[j];
    if (!p.is_object()) return WrongType(part, "an object", p);
    auto type = p.find("type");
    if (type == p.end() || !type->is_string()) {
      return Bad(absl::StrCat(part, ".type"), "is required and must be a string");
    }
    if (type->get<std::string>() != "text") {
      return Bad(absl::StrCat(part, ".type"),
                 absl::StrCat("content parts of type '", type->get<std::string>(),
                              "' are not supported; only 'text'"));
    }
    for (const auto& [key, value] : p.items()) {
      if (key == "type") continue;
      if (key != "text") return Bad(absl::StrCat(part, ".", key), "unrecognized field");
      if (!value.is_string()) return WrongType(absl::StrCat(part, ".text"), "a string", value);
      text += value.get<std::string>();
    }
  }
  return text;
}

absl::Status ParseMessages(const json& v, const ParseLimits& limits, OpenAiRequest* r) {
  if (!v.is_array()) return WrongType("messages", "an array", v);
  if (v.empty()) return Bad("messages", "must not be empty");
  if (v.size() > limits.max_messages) {
    return Bad("messages",
               absl::StrCat("at most ", limits.max_messages, " messages, got ", v.size()));
  }
  for (size_t i = 0; i < v.size(); ++i) {
    const std::string param = absl::StrCat("messages[", i, "]");
    const json& m = v[i];
    if (!m.is_object()) return WrongType(param, "an object", m);
    auto role_it = m.find("role");
    if (role_it == m.end() || !role_it->is_string()) {
      return Bad(absl::StrCat(param, ".role"), "is required and must be a string");
    }
    std::string role = role_it->get<std::string>();
    if (role == "developer") role = "system";
    // The legacy functions API: a function's result is a tool message (named by `name`).
    const bool function_result = role == "function";
    if (function_result) role = "tool";
    if (role != "system" && role != "user" && role != "assistant" && role != "tool") {
      return Bad(absl::StrCat(param, ".role"),
                 absl::StrCat("role '", role_it->get<std::string>(),
                              "' is not supported; use system, developer, user, assistant or "
                              "tool"));
    }
    ChatMessage msg;
    msg.role = role;
    bool has_content = false;
    for (const auto& [key, value] : m.items()) {
      const std::string field = absl::StrCat(param, ".", key);
      if (key == "role") continue;
      if (key == "content") {
        PD_ASSIGN_OR_RETURN(std::string content, ParseContent(field, value, role));
        msg.content = std::move(content);
        msg.content_null = value.is_null();
        has_content = true;
      } else if (key == "name") {
        if (!value.is_string() && !value.is_null()) return WrongType(field, "a string", value);
        if (value.is_string()) msg.name = value.get<std::string>();
      } else if (key == "tool_calls") {
        if (value.is_null()) continue;
        if (role != "assistant") return Bad(field, "only assistant messages carry tool calls");
        if (!msg.tool_calls_json.empty()) return Bad(field, "cannot be combined with function_call");
        PD_ASSIGN_OR_RETURN(msg.tool_calls_json, ParseHistoryToolCalls(field, value));
        for (const json& call : value) {
          msg.tool_call_arguments.push_back(call["function"]["arguments"].get<std::string>());
        }
      } else if (key == "tool_call_id") {
        if (value.is_null()) continue;
        if (role != "tool") return Bad(field, "only tool messages answer a tool call");
        PD_ASSIGN_OR_RETURN(msg.tool_call_id, GetString(field, value));
      } else if (key == "function_call") {
        // The legacy functions API: an assistant's call, as one tool call.
        if (value.is_null()) continue;
        if (role != "assistant") return Bad(field, "only assistant messages carry a function call");
        if (!msg.tool_calls_json.empty()) return Bad(field, "cannot be combined with tool_calls");
        if (!value.is_object()) return WrongType(field, "an object {name, arguments}", value);
        const json calls = json::array(
            {json{{"id", absl::StrCat("call_", i)}, {"type", "function"}, {"function", value}}});
        absl::StatusOr<std::string> parsed = ParseHistoryToolCalls(field, calls);
        if (!parsed.ok()) {
          return Bad(field, "must be {\"name\": a string, \"arguments\": a string}");
        }
        msg.tool_calls_json = *std::move(parsed);
        msg.tool_call_arguments = {value["arguments"].get<std::string>()};
      } else if (key == "audio" || key == "refusal") {
        if (!value.is_null()) return Bad(field, "is not supported by this server");
      } else {
        return Bad(field, "unrecognized field");
      }
    }
    if (function_result && msg.name.empty()) {
      return Bad(absl::StrCat(param, ".name"), "is required: the function whose result this is");
    }
    if (!has_content && role != "assistant") {
      return Bad(absl::StrCat(param, ".content"), "is required");
    }
    if (!has_content) msg.content_null = true;
    r->messages.push_back(std::move(msg));
  }
  return absl::OkStatus();
}

// A number in [lo, hi] (finite), as a float.
absl::StatusOr<float> GetNumberIn(const std::string& param, const json& v, double lo, double hi) {
  PD_ASSIGN_OR_RETURN(double d, GetNumber(param, v));
  if (d < lo || d > hi) return Bad(param, absl::StrCat("must be in [", lo, ", ", hi, "], got ", d));
  return static_cast<float>(d);
}

// "logit_bias": OpenAI's map of token ids (as JSON object keys, decimal strings) to a bias in
// [-100, 100], at most limits.max_logit_bias entries; ids below limits.vocab_size when known.
// Errors name the offending key.
absl::Status ParseLogitBias(const json& v, const ParseLimits& limits,
                            pdserve::v1::SamplingParams* s) {
  constexpr char kKey[] = "logit_bias";
  if (!v.is_object()) return WrongType(kKey, "an object of token ids to numbers", v);
  if (v.size() > limits.max_logit_bias) {
    return Bad(kKey, absl::StrCat("at most ", limits.max_logit_bias, " entries, got ", v.size()));
  }
  for (const auto& [key, value] : v.items()) {
    const std::string shown = absl::StrCat("key \"", key.substr(0, 32), "\"");
    uint32_t id = 0;
    const bool digits =
        !key.empty() && key.size() <= 10 &&
        std::all_of(key.begin(), key.end(), [](char c) { return c >= '0' && c <= '9'; });
    if (!digits || !absl::SimpleAtoi(key, &id)) {
      return Bad(kKey, absl::StrCat(shown, " is not a token id (a decimal integer)"));
    }
    if (limits.vocab_size > 0 && id >= limits.vocab_size) {
      return Bad(kKey,
                 absl::StrCat(shown, ": token id ", id, " is not in the vocabulary (its size is ",
                              limits.vocab_size, ")"));
    }
    if (!value.is_number()) {
      return Bad(kKey, absl::StrCat(shown, ": the bias must be a number, got ", TypeName(value)));
    }
    const double bias = value.get<double>();
    if (!(bias >= -100.0 && bias <= 100.0)) {
      return Bad(kKey, absl::StrCat(shown, ": the bias must be in [-100, 100], got ", bias));
    }
    (*s->mutable_logit_bias())[id] = static_cast<float>(bias);
  }
  return absl::OkStatus();
}

// Fields that exist in the OpenAI API but which this server cannot honour: refused unless null
// or at the value that changes nothing.
absl::Status CheckUnsupported(const std::string& key, const json& v) {
  if (v.is_null()) return absl::OkStatus();
  // Chat reads the tool fields (tool_request.h); completions have no tools.
  if (key == "tool_choice" || key == "function_call") {
    if (v == "none") return absl::OkStatus();
    return Bad(key, "tools are only supported on /v1/chat/completions");
  }
  if (key == "tools" || key == "functions") {
    if (v.is_array() && v.empty()) return absl::OkStatus();
    return Bad(key, "tools are only supported on /v1/chat/completions");
  }
  if (key == "suffix") {
    if (v.is_string() && v.get<std::string>().empty()) return absl::OkStatus();
    return Bad(key, "is not supported by this server");
  }
  // No effect on the output, but checked as OpenAI types them.
  if (key == "metadata") return ParseMetadata(v);
  if (key == "parallel_tool_calls" || key == "store") return GetBool(key, v).status();
  if (key == "service_tier" || key == "user") return GetString(key, v).status();
  return Bad(key, "is not supported by this server");
}

// Structured output: OpenAI's response_format and vLLM's guided_* / structured_outputs. Keys
// are read from `ordered` (the body parsed keeping key order: a schema's property order is the
// order the output's keys are generated in). At most one constraint per request.
bool IsConstraintKey(const std::string& key) {
  return key == "response_format" || key == "guided_json" || key == "guided_regex" ||
         key == "guided_choice" || key == "guided_grammar" || key == "structured_outputs" ||
         key == "guided_decoding_backend" || key == "guided_whitespace_pattern";
}

using ordered_json = nlohmann::ordered_json;

absl::StatusOr<std::string> SchemaText(const std::string& param, const ordered_json& v) {
  if (v.is_string()) {  // vLLM also takes the schema as a JSON string
    const ordered_json parsed = ordered_json::parse(v.get<std::string>(), nullptr, false);
    if (parsed.is_discarded()) return Bad(param, "is a string but not a JSON document");
    return parsed.dump();
  }
  if (!v.is_object() && !v.is_boolean()) {
    return Bad(param, "must be a JSON Schema (an object)");
  }
  return v.dump();
}

absl::Status ParseConstraint(const ordered_json& doc, pdserve::v1::SamplingParams* s) {
  std::string source;  // the parameter that set the constraint
  pdserve::v1::OutputConstraint c;
  auto take = [&](const std::string& param) -> absl::Status {
    if (!source.empty()) {
      return Bad(param, absl::StrCat("conflicts with ", source, " (one constraint per request)"));
    }
    source = param;
    return absl::OkStatus();
  };
  auto set_choices = [&](const std::string& param, const ordered_json& v) -> absl::Status {
    if (!v.is_array() || v.empty()) return Bad(param, "must be a non-empty array of strings");
    for (size_t i = 0; i < v.size(); ++i) {
      if (!v[i].is_string()) {
        return Bad(absl::StrCat(param, "[", i, "]"), "must be a string");
      }
      c.mutable_choice()->add_values(v[i].get<std::string>());
    }
    return absl::OkStatus();
  };
  // One of vLLM's forms: "json" (a schema), "regex", "grammar" (GBNF) or "choice", given as
  // `param`.
  auto set_form = [&](const std::string& param, const std::string& form,
                      const ordered_json& v) -> absl::Status {
    PD_RETURN_IF_ERROR(take(param));
    if (form == "json") {
      PD_ASSIGN_OR_RETURN(std::string text, SchemaText(param, v));
      c.set_json_schema(std::move(text));
    } else if (form == "regex") {
      if (!v.is_string()) return Bad(param, "must be a string");
      c.set_regex(v.get<std::string>());
    } else if (form == "grammar") {
      if (!v.is_string()) return Bad(param, "must be a string (a GBNF grammar)");
      c.set_grammar(v.get<std::string>());
    } else {
      PD_RETURN_IF_ERROR(set_choices(param, v));
    }
    return absl::OkStatus();
  };
  for (const auto& [key, v] : doc.items()) {
    if (!IsConstraintKey(key) || v.is_null()) continue;
    if (key == "response_format") {
      if (!v.is_object()) return Bad(key, absl::StrCat("must be an object"));
      const auto type = v.find("type");
      if (type == v.end() || !type->is_string()) {
        return Bad("response_format.type",
                   "is required: \"text\", \"json_object\", \"json_schema\" or \"structural_tag\"");
      }
      const std::string t = type->get<std::string>();
      for (const auto& [k2, v2] : v.items()) {
        if (k2 != "type" && !(t == "json_schema" && k2 == "json_schema") &&
            !(t == "structural_tag" && (k2 == "structures" || k2 == "triggers"))) {
          return Bad(absl::StrCat("response_format.", k2),
                     t == "structural_tag" && k2 == "format"
                         ? "is not supported: give the tag as \"structures\" and \"triggers\""
                         : "unrecognized field");
        }
      }
      if (t == "text") continue;
      PD_RETURN_IF_ERROR(take(key));
      if (t == "structural_tag") {
        // Checked and compiled with the other constraints (request_validation.cc); errors
        // name the tag's own fields (triggers[0], structures[1].begin, ...).
        c.set_structural_tag(v.dump());
      } else if (t == "json_object") {
        c.set_json_object(true);
      } else if (t == "json_schema") {
        const auto js = v.find("json_schema");
        if (js == v.end() || !js->is_object()) {
          return Bad("response_format.json_schema",
                     "is required (an object with \"name\" and \"schema\")");
        }
        for (const auto& [k3, v3] : js->items()) {
          const std::string field = absl::StrCat("response_format.json_schema.", k3);
          if (k3 == "name" || k3 == "description") {
            if (!v3.is_string()) return Bad(field, "must be a string");
          } else if (k3 == "strict") {
            // Always strict: the output follows the schema exactly, or the schema is refused.
            if (!v3.is_boolean() && !v3.is_null()) return Bad(field, "must be a boolean");
          } else if (k3 != "schema") {
            return Bad(field, "unrecognized field");
          }
        }
        const auto schema = js->find("schema");
        if (schema == js->end()) {
          return Bad("response_format.json_schema.schema", "is required");
        }
        PD_ASSIGN_OR_RETURN(std::string text,
                            SchemaText("response_format.json_schema.schema", *schema));
        c.set_json_schema(std::move(text));
      } else {
        return Bad("response_format.type",
                   absl::StrCat("must be \"text\", \"json_object\", \"json_schema\" or "
                                "\"structural_tag\", got \"",
                                t.substr(0, 64), "\""));
      }
    } else if (key == "guided_json" || key == "guided_regex" || key == "guided_choice" ||
               key == "guided_grammar") {
      PD_RETURN_IF_ERROR(set_form(key, key.substr(7), v));
    } else if (key == "guided_whitespace_pattern") {
      return Bad(key, "is not supported by this server (whitespace is bounded by the engine)");
    } else if (key == "guided_decoding_backend") {
      if (!v.is_string()) return Bad(key, "must be a string");  // one engine here: ignored
    } else if (key == "structured_outputs") {
      if (!v.is_object()) return Bad(key, "must be an object");
      for (const auto& [k2, v2] : v.items()) {
        const std::string field = absl::StrCat(key, ".", k2);
        if (v2.is_null()) continue;
        if (k2 == "json" || k2 == "regex" || k2 == "choice" || k2 == "grammar") {
          PD_RETURN_IF_ERROR(set_form(field, k2, v2));
        } else if (k2 == "json_object") {
          if (!v2.is_boolean()) return Bad(field, "must be a boolean");
          if (!v2.get<bool>()) continue;
          PD_RETURN_IF_ERROR(take(field));
          c.set_json_object(true);
        } else if (k2 == "structural_tag") {
          // vLLM takes the tag as a JSON string; an object is taken too.
          PD_RETURN_IF_ERROR(take(field));
          if (v2.is_string()) {
            const ordered_json tag = ordered_json::parse(v2.get<std::string>(), nullptr, false);
            if (tag.is_discarded()) return Bad(field, "is a string but not a JSON document");
            c.set_structural_tag(tag.dump());
          } else if (v2.is_object()) {
            c.set_structural_tag(v2.dump());
          } else {
            return Bad(field, "must be a structural tag (a JSON object or its text)");
          }
        } else {
          return Bad(field, "unrecognized field");
        }
      }
    }
  }
  if (!source.empty()) {
    *s->mutable_constraint() = std::move(c);
  }
  return absl::OkStatus();
}

// Tool calling (tool_request.h), chat only; read from the order-keeping parse (a function's
// parameters schema fixes the order of the arguments' keys).
bool IsToolKey(const std::string& key) {
  return key == "tools" || key == "tool_choice" || key == "parallel_tool_calls" ||
         key == "functions" || key == "function_call";
}

bool IsKnownUnsupported(const std::string& key) {
  static const char* const kKeys[] = {"tool_choice",
                                      "tools",
                                      "functions",
                                      "function_call",
                                      "suffix",
                                      "parallel_tool_calls",
                                      "store",
                                      "metadata",
                                      "service_tier",
                                      "user",
                                      "audio",
                                      "modalities",
                                      "prediction",
                                      "reasoning_effort",
                                      "web_search_options"};
  for (const char* k : kKeys) {
    if (key == k) return true;
  }
  return false;
}

}  // namespace

absl::string_view EndpointName(Endpoint endpoint) {
  return endpoint == Endpoint::kChat ? "chat.completions" : "completions";
}

std::string ParamOf(const absl::Status& status) {
  absl::optional<absl::Cord> p = status.GetPayload(kParamPayload);
  return p.has_value() ? std::string(*p) : std::string();
}

absl::Status WithParam(absl::Status status, absl::string_view param) {
  status.SetPayload(kParamPayload, absl::Cord(param));
  return status;
}

JsonDepth JsonNestingDepth(absl::string_view text, size_t stop_at) {
  JsonDepth out;
  size_t depth = 0;
  size_t string_start = 0;
  absl::string_view last_top_string;  // the latest string at depth 1: the key being read
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') {
        ++i;  // the escaped character, whatever it is
      } else if (c == '"') {
        in_string = false;
        if (depth == 1) last_top_string = text.substr(string_start, i - string_start);
      }
      continue;
    }
    if (c == '"') {
      in_string = true;
      string_start = i + 1;
    } else if (c == '[' || c == '{') {
      if (++depth > out.depth) {
        out.depth = depth;
        if (depth > stop_at) {
          out.field = std::string(last_top_string.substr(0, 64));
          return out;
        }
      }
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
  return out;
}

absl::StatusOr<OpenAiRequest> ParseRequest(Endpoint endpoint, absl::string_view body,
                                           const ParseLimits& limits) {
  // Bounded before anything walks the document (the parser's own stack included).
  if (const JsonDepth d = JsonNestingDepth(body, limits.max_json_depth);
      d.depth > limits.max_json_depth) {
    const std::string what = d.field.empty() ? "request body" : d.field;
    return WithParam(
        absl::InvalidArgumentError(absl::StrCat(what, ": arrays/objects nested deeper than ",
                                                limits.max_json_depth, " levels")),
        d.field);
  }
  const json doc = json::parse(body.begin(), body.end(), nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) {
    return absl::InvalidArgumentError("request body is not valid JSON (or not valid UTF-8)");
  }
  if (!doc.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat("request body must be a JSON object, got ", TypeName(doc)));
  }
  OpenAiRequest r;
  r.endpoint = endpoint;
  const bool chat = endpoint == Endpoint::kChat;
  pdserve::v1::SamplingParams& s = r.sampling;
  s.set_temperature(1.0f);
  s.set_top_p(1.0f);
  s.set_max_tokens(chat ? 0 : 16);
  bool has_model = false;
  bool has_input = false;
  std::optional<int64_t> best_of;
  bool logprobs_flag = false;           // chat "logprobs": true
  std::optional<int64_t> top_logprobs;  // chat
  std::optional<int64_t> max_tokens;
  std::optional<int64_t> max_completion_tokens;
  bool has_constraint_keys = false;
  bool has_tool_keys = false;
  for (const auto& [key, v] : doc.items()) {
    // Explicit nulls mean "not set" (some clients send every field).
    if (v.is_null() && key != "model" && key != "messages" && key != "prompt") continue;
    if (key == "model") {
      PD_ASSIGN_OR_RETURN(std::string m, GetString(key, v));
      r.model = std::move(m);
      has_model = true;
    } else if (key == "prompt" && !chat) {
      PD_RETURN_IF_ERROR(ParsePrompt(v, limits, &r));
      has_input = true;
    } else if (key == "messages" && chat) {
      PD_RETURN_IF_ERROR(ParseMessages(v, limits, &r));
      has_input = true;
    } else if (key == "max_tokens" || key == "max_completion_tokens") {
      PD_ASSIGN_OR_RETURN(int64_t n, GetInt(key, v, 1, limits.max_tokens_limit));
      (key == "max_tokens" ? max_tokens : max_completion_tokens) = n;
    } else if (key == "min_tokens") {
      PD_ASSIGN_OR_RETURN(int64_t n, GetInt(key, v, 0, limits.max_tokens_limit));
      s.set_min_tokens(static_cast<uint32_t>(n));
    } else if (key == "temperature") {
      PD_ASSIGN_OR_RETURN(double t, GetNumber(key, v));
      if (t < 0 || t > 2) return Bad(key, absl::StrCat("must be in [0, 2], got ", t));
      s.set_temperature(static_cast<float>(t));
    } else if (key == "top_p") {
      PD_ASSIGN_OR_RETURN(double p, GetNumber(key, v));
      if (p <= 0 || p > 1) return Bad(key, absl::StrCat("must be in (0, 1], got ", p));
      s.set_top_p(static_cast<float>(p));
    } else if (key == "top_k") {
      PD_ASSIGN_OR_RETURN(int64_t k, GetInt(key, v, -1, 1 << 20));
      s.set_top_k(k <= 0 ? 0 : static_cast<uint32_t>(k));  // -1 and 0 = off (vLLM)
    } else if (key == "min_p") {
      PD_ASSIGN_OR_RETURN(float p, GetNumberIn(key, v, 0.0, 1.0));
      s.set_min_p(p);
    } else if (key == "presence_penalty" || key == "frequency_penalty") {
      PD_ASSIGN_OR_RETURN(float p, GetNumberIn(key, v, -2.0, 2.0));
      if (key == "presence_penalty") {
        s.set_presence_penalty(p);
      } else {
        s.set_frequency_penalty(p);
      }
    } else if (key == "repetition_penalty") {
      PD_ASSIGN_OR_RETURN(double r, GetNumber(key, v));
      // vLLM's bound: > 0 (a float that rounds to 0 is refused too: the wire's 0 means unset).
      if (!(r > 0) || static_cast<float>(r) <= 0.0f || !std::isfinite(static_cast<float>(r))) {
        return Bad(key, absl::StrCat("must be > 0 (1 = off), got ", r));
      }
      s.set_repetition_penalty(static_cast<float>(r));
    } else if (key == "logit_bias") {
      PD_RETURN_IF_ERROR(ParseLogitBias(v, limits, &s));
    } else if (key == "seed") {
      PD_ASSIGN_OR_RETURN(int64_t seed, GetInt(key, v, std::numeric_limits<int64_t>::min(),
                                               std::numeric_limits<int64_t>::max()));
      s.set_seed(static_cast<uint64_t>(seed));
    } else if (key == "stop") {
      PD_RETURN_IF_ERROR(ParseStop(v, limits, &s));
    } else if (key == "stop_token_ids") {
      if (!v.is_array()) return WrongType(key, "an array of token ids", v);
      PD_ASSIGN_OR_RETURN(std::vector<uint32_t> ids, ParseTokenIds(key, v, 1024));
      for (uint32_t id : ids) s.add_stop_token_ids(id);
    } else if (key == "ignore_eos") {
      PD_ASSIGN_OR_RETURN(bool b, GetBool(key, v));
      s.set_ignore_eos(b);
    } else if (key == "n") {
      PD_ASSIGN_OR_RETURN(int64_t n, GetInt(key, v, 1, limits.max_n));
      r.n = static_cast<int32_t>(n);
    } else if (key == "best_of") {
      PD_ASSIGN_OR_RETURN(int64_t n, GetInt(key, v, 1, limits.max_n));
      best_of = n;
    } else if (key == "stream") {
      PD_ASSIGN_OR_RETURN(bool b, GetBool(key, v));
      r.stream = b;
    } else if (key == "stream_options") {
      if (!v.is_object()) return WrongType(key, "an object", v);
      for (const auto& [k2, v2] : v.items()) {
        const std::string field = absl::StrCat(key, ".", k2);
        if (k2 == "include_usage") {
          PD_ASSIGN_OR_RETURN(bool b, GetBool(field, v2));
          r.include_usage = b;
        } else if (k2 == "continuous_usage_stats") {
          PD_ASSIGN_OR_RETURN(bool b, GetBool(field, v2));
          if (b) return Bad(field, "is not supported by this server");
        } else {
          return Bad(field, "unrecognized field");
        }
      }
    } else if (key == "echo" && !chat) {
      PD_ASSIGN_OR_RETURN(bool b, GetBool(key, v));
      r.echo = b;
    } else if (key == "logprobs") {
      if (chat) {
        PD_ASSIGN_OR_RETURN(bool b, GetBool(key, v));
        logprobs_flag = b;
      } else {
        PD_ASSIGN_OR_RETURN(int64_t n, GetInt(key, v, 0, limits.max_top_logprobs));
        r.logprobs = static_cast<int32_t>(n);
      }
    } else if (key == "top_logprobs" && chat) {
      PD_ASSIGN_OR_RETURN(int64_t n, GetInt(key, v, 0, limits.max_top_logprobs));
      top_logprobs = n;
    } else if (key == "chat_template_kwargs" && chat) {
      if (!v.is_object()) return Bad(key, "must be an object");
      for (const auto& [name, value] : v.items()) {
        if (name == "messages" || name == "tools" || name == "add_generation_prompt") {
          return Bad(key, absl::StrCat("\"", name,
                                       "\" is set by the request itself, not by "
                                       "chat_template_kwargs"));
        }
      }
      r.chat_template_kwargs = v.dump();
    } else if (key == "add_generation_prompt" && chat) {
      PD_ASSIGN_OR_RETURN(bool b, GetBool(key, v));
      r.add_generation_prompt = b;
    } else if (key == "cache_salt") {
      PD_ASSIGN_OR_RETURN(std::string salt, GetString(key, v));
      r.cache_salt = std::move(salt);
    } else if (IsConstraintKey(key)) {
      has_constraint_keys = true;  // read below, from the order-keeping parse
    } else if (chat && IsToolKey(key)) {
      has_tool_keys = true;  // read below, from the order-keeping parse
    } else if (IsKnownUnsupported(key)) {
      PD_RETURN_IF_ERROR(CheckUnsupported(key, v));
    } else {
      return Bad(key, absl::StrCat("unrecognized request argument for /v1/",
                                   chat ? "chat/completions" : "completions"));
    }
  }
  if (has_constraint_keys || has_tool_keys) {
    const ordered_json ordered =
        ordered_json::parse(body.begin(), body.end(), nullptr, /*allow_exceptions=*/false);
    if (has_constraint_keys) PD_RETURN_IF_ERROR(ParseConstraint(ordered, &s));
    if (has_tool_keys) {
      PD_ASSIGN_OR_RETURN(r.tools, ParseTools(ordered));
      if (r.tools.enforced()) {
        if (s.has_constraint()) {
          return Bad("tool_choice",
                     "an enforced tool choice (\"required\" or a named function) cannot be "
                     "combined with response_format or guided_* (one constraint per request)");
        }
        s.mutable_constraint()->set_json_schema(EnforcedCallSchema(r.tools));
      }
    }
    if (s.has_constraint() && (s.min_tokens() > 0 || s.ignore_eos())) {
      return Bad(s.min_tokens() > 0 ? "min_tokens" : "ignore_eos",
                 "cannot be combined with structured output (the constraint decides where the "
                 "output ends)");
    }
  }
  if (!has_model) return Bad("model", "is required");
  if (!has_input) {
    return chat ? Bad("messages", "is required") : Bad("prompt", "is required");
  }
  if (max_tokens.has_value() && max_completion_tokens.has_value() &&
      *max_tokens != *max_completion_tokens) {
    return Bad("max_completion_tokens", "differs from max_tokens; send one of them");
  }
  if (max_completion_tokens.has_value())
    s.set_max_tokens(static_cast<uint32_t>(*max_completion_tokens));
  if (max_tokens.has_value()) s.set_max_tokens(static_cast<uint32_t>(*max_tokens));
  if (s.min_tokens() > 0 && s.max_tokens() > 0 && s.min_tokens() > s.max_tokens()) {
    return Bad("min_tokens", "must not exceed max_tokens");
  }
  if (chat) {
    if (top_logprobs.has_value() && !logprobs_flag) {
      return Bad("top_logprobs", "needs \"logprobs\": true");
    }
    if (logprobs_flag) r.logprobs = static_cast<int32_t>(top_logprobs.value_or(0));
  }
  if (r.echo && r.logprobs >= 0) {
    return Bad("echo", "echo with logprobs (prompt logprobs) is not supported by this server");
  }
  if (r.include_usage && !r.stream) {
    return Bad("stream_options", "is only allowed with \"stream\": true");
  }
  if (best_of.has_value() && *best_of != r.n) {
    return Bad("best_of", absl::StrCat("must equal n (", r.n, "): this server returns every "
                                       "choice it generates, it does not rank them"));
  }
  return r;
}

}  // namespace pd::router::openai
