// Structural tags: free text in which a trigger string starts a structured part. The output is
// any text until it writes one of the triggers; from there it must continue to one of the
// structures that begin with that trigger (its `begin` string, a JSON document its `schema`
// accepts, its `end` string), and then it is free text again. This is vLLM's and XGrammar's
// `structural_tag` response format, and what enforces a tool call that a model chose to make
// (`tool_choice: "auto"`: `<tool_call>` starts a call whose arguments follow the tool's
// parameters).
//
// It compiles to an ordinary Grammar, so everything the matcher does (token masks, speculation,
// replay after a hand-off) works unchanged: the free text is the automaton of the triggers
// (Aho-Corasick: one rule per state, reading any byte), whose states where a trigger ends lead
// into the structures; each structure's schema is compiled by CompileJsonSchema and embedded.
// Free text may end anywhere (the end token is allowed there); inside a structure it may not.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "engine/grammar/grammar.h"
#include "engine/grammar/json_schema.h"

namespace pd::grammar {

struct StructuralTag {
  struct Structure {
    std::string begin;   // starts with one of the triggers
    std::string schema;  // JSON Schema text
    std::string end;
  };
  std::vector<Structure> structures;
  std::vector<std::string> triggers;
  // pdserve's extension (`"at_start": true`): a trigger counts only at the start of the output
  // (after any whitespace), and the output ends with the structure. Elsewhere the triggers are
  // plain text. For a family whose call is the whole output (Llama 3's JSON calls: an output
  // that starts with `{` is a call, any other is text).
  bool at_start = false;
  // pdserve's extension (`"special_tokens": [...]`): texts that, wherever they occur in the
  // triggers, begins and ends, stand for the model's special token of that text (its control
  // token, which decodes to no text; grammar.h's SpecialTokenBytes), not for the text. A
  // trigger holding one must start with it. Free text never holds a special token: one is
  // written only where a trigger, begin or end names it. A special token the model's
  // vocabulary lacks can never be written, so the structures it begins never start.
  std::vector<std::string> special_tokens;
};

// Limits: structures, triggers, bytes of one trigger, bytes of a begin or end string.
inline constexpr size_t kMaxTagStructures = 256;
inline constexpr size_t kMaxTagTriggers = 16;
inline constexpr size_t kMaxTriggerBytes = 64;
inline constexpr size_t kMaxTagStringBytes = 1024;

// Reads vLLM's form, `{"structures": [{"begin", "schema", "end"}, ...], "triggers": [...]}`
// (a "type": "structural_tag" member is allowed, "at_start", a boolean, and "special_tokens",
// an array of strings). InvalidArgument naming the field (the caller adds where the tag came
// from): a missing or mistyped field, an unknown one, an empty trigger, a begin that starts
// with no trigger, a trigger that begins no structure, a trigger with a special token not at
// its start, an empty or repeated special token, anything over the limits above.
absl::StatusOr<StructuralTag> ParseStructuralTag(absl::string_view json);

// The tag as canonical JSON text (ParseStructuralTag's input form; schemas compact).
std::string StructuralTagJson(const StructuralTag& tag);

// Compiles the tag (as ParseStructuralTag checks it) into a grammar; a structure's schema
// error is returned with the structure named.
absl::StatusOr<Grammar> CompileStructuralTag(const StructuralTag& tag,
                                             const JsonSchemaOptions& options);

// A reasoning model's output under a constraint: first, optionally, a reasoning block
// `start` + free text + `end` (with `opened` the output starts inside the block, which the
// prompt opened, and must close it), then at most two newlines, then a sentence of `inner`. The
// block's free text is any bytes not containing `end`; the output may not end inside it.
// InvalidArgument when `end` is empty or longer than kMaxTriggerBytes, or `start` is empty
// without `opened`.
absl::StatusOr<Grammar> AfterReasoning(const Grammar& inner, absl::string_view start,
                                       absl::string_view end, bool opened);

}  // namespace pd::grammar
