// Tool calling on POST /v1/chat/completions, request side: the `tools`, `tool_choice` and
// `parallel_tool_calls` fields, the tool calls of an assistant message in the history, and the
// JSON Schema that enforces a call when tool_choice is "required" or names a function
// (docs/structured-outputs.md, "Tools").
//
// Errors are InvalidArgument naming the field (ParamOf), as openai_request.h's are.
//
// Pure functions; thread-safe.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json_fwd.hpp"
#include "services/router/openai/tool_parser.h"

namespace pd::router::openai {

// Limits of the tools a request offers.
inline constexpr size_t kMaxTools = 128;
inline constexpr size_t kMaxToolNameBytes = 64;  // names match ^[a-zA-Z0-9_-]{1,64}$

enum class ToolChoice {
  kNone,      // no tool is offered to the model; nothing is parsed
  kAuto,      // tools are offered; the output is parsed for calls (tool_parser.h)
  kRequired,  // the output is one call of any offered function (enforced)
  kFunction,  // the output is one call of ToolsSpec::function (enforced)
};

// One offered function.
struct ToolFunction {
  std::string name;
  // Its `parameters` JSON Schema as compact JSON text, keys in request order (the order the
  // arguments' keys are generated in); "" when the tool gave none (no arguments: `{}`).
  std::string parameters;
};

// What a request asks of tools. The default (no `tools`) offers none.
struct ToolsSpec {
  std::vector<ToolFunction> functions;
  // The `tools` array as sent (compact JSON, key order kept), given to the chat template as
  // its `tools` variable; "" without tools.
  std::string tools_json;
  ToolChoice choice = ToolChoice::kNone;
  std::string function;  // kFunction: the function's name
  // OpenAI's default is true. An enforced choice yields one call unless the request set it to
  // true explicitly (`parallel_tool_calls_set`): then an array of one or more calls.
  bool parallel_tool_calls = true;
  bool parallel_tool_calls_set = false;
  // Asked with the legacy `functions` / `function_call` (OpenAI's API before tools): the
  // answer carries `message.function_call` (one call at most) and finish_reason
  // "function_call" instead of `tool_calls`.
  bool legacy = false;

  // Tools go to the chat template and the output may hold calls.
  bool offered() const { return choice != ToolChoice::kNone && !functions.empty(); }
  // The output is exactly one call, enforced by a JSON Schema constraint.
  bool enforced() const {
    return choice == ToolChoice::kRequired || choice == ToolChoice::kFunction;
  }
  // Enforced, as an array of one or more calls (`parallel_tool_calls: true` sent).
  bool enforced_list() const {
    return enforced() && !legacy && parallel_tool_calls_set && parallel_tool_calls;
  }
  // The names of the functions a call may name (the named one alone for kFunction).
  std::vector<std::string> CallableNames() const;
};

// Reads `tools`, `tool_choice` and `parallel_tool_calls` from `body` (the request parsed with
// key order kept; absent or null fields take OpenAI's defaults: choice "auto" with tools, "none"
// without). InvalidArgument naming the field: a tool type other than "function", a missing or
// malformed name (^[a-zA-Z0-9_-]{1,64}$), duplicate names, more than kMaxTools tools,
// `parameters` that is not an object, unknown fields, a tool_choice naming no offered function
// or given without tools. The legacy `functions` (function objects) and `function_call`
// ("none", "auto" or {"name": ...}) are read into the same spec with `legacy` set; mixing
// them with `tools`/`tool_choice` is InvalidArgument.
absl::StatusOr<ToolsSpec> ParseTools(const nlohmann::ordered_json& body);

// The JSON Schema text of an enforced call (spec.enforced()): an object {"name": <const>,
// "arguments": <the function's parameters>} with both members required and no others; for
// "required" with several functions, anyOf over one such object per function; with
// spec.enforced_list(), an array of at least one such call.
std::string EnforcedCallSchema(const ToolsSpec& spec);

// The Hermes/Qwen call markers (tool_parser.h's kHermes format).
inline constexpr char kHermesCallOpen[] = "<tool_call>";
inline constexpr char kHermesCallClose[] = "</tool_call>";

// The structural tag (engine/grammar/structural_tag.h, as JSON text) that enforces a call a
// model chooses to make under tool_choice "auto". Hermes format: free text until it writes
// `<tool_call>`, then `\n{"name": "<an offered function>", "arguments": ` and arguments that
// follow that function's parameters, then `}\n</tool_call>`, then free text again (more calls,
// or not): the layout Qwen's and Hermes's chat templates teach. DeepSeek format: free text
// until `<｜tool▁calls▁begin｜>`, then one call as DeepSeek-V3's template writes it
// (`<｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\n```json\nARGS\n```<｜tool▁call▁end｜>`; with
// `fenced` false, V3.1's `<｜tool▁call▁begin｜>NAME<｜tool▁sep｜>ARGS<｜tool▁call▁end｜>`), then
// `<｜tool▁calls▁end｜>`: one call per block (another block may follow). Llama 3 format: the
// call is the whole output, `{"name": "<an offered function>", "parameters": ` and arguments
// that follow its parameters, then `}`, when the output starts with `{` (after whitespace;
// the tag's `at_start`); any other output is text. Mistral (v3 templates): the output starts
// with `[TOOL_CALLS]` (after whitespace; `at_start`), then a JSON array of calls
// `{"name": "<an offered function>", "arguments": ...}` (one at most when
// `parallel_tool_calls` is false), and ends there; any other output is text. Mistral v11+
// (`variant.mistral_named`): free text until `[TOOL_CALLS]`, then `NAME[ARGS]` and arguments
// that follow its parameters, then free text again (more calls, or not). Mistral's markers
// are the tag's special tokens (structural_tag.h) unless `variant.mistral_special` is false.
struct CallTagVariant {
  bool fenced = true;           // DeepSeek: V3's fenced arguments (false: V3.1's)
  bool mistral_named = false;   // Mistral: v11+'s `[TOOL_CALLS]NAME[ARGS]{...}` (v3's list)
  bool mistral_special = true;  // Mistral: the model's markers are special tokens
};
std::string AutoCallTag(const ToolsSpec& spec, ToolCallFormat format = ToolCallFormat::kHermes,
                        const CallTagVariant& variant = {});

// An assistant message's `tool_calls` (`param` names it in errors): an array of {"id",
// "type": "function", "function": {"name", "arguments": a string}}. Returns the calls in the
// shape chat templates expect (as Hugging Face and vLLM pass them), as compact JSON text: each
// call's `arguments` parsed into an object when it is a JSON object, kept as a string otherwise.
absl::StatusOr<std::string> ParseHistoryToolCalls(absl::string_view param, const nlohmann::json& v);

}  // namespace pd::router::openai
