// JSON Schema (a draft 2020-12 subset, with the draft-04/07 spellings still found in the wild)
// compiled into a Grammar whose sentences are exactly the JSON documents the schema accepts, in
// one canonical layout: members in the schema's `properties` order, strings escaped as JSON
// serializers write them (\" \\ \b \f \n \r \t and \u00xx for other controls, everything else
// raw UTF-8), and at most `max_whitespace` whitespace bytes at each place JSON allows it.
//
// Enforced: `type` (and unions), `enum`, `const`, `properties`, `required`,
// `additionalProperties`, `patternProperties` (one pattern; keys outside it are not produced),
// property dependencies (`dependencies`, `dependentRequired`, `dependentSchemas`), `items`,
// `prefixItems` (and draft-04 array `items`), `additionalItems`, `minItems`, `maxItems`, `anyOf`,
// `oneOf` (when its branches cannot overlap), `allOf` (merged),
// `$ref` to `#...` with `$defs`/`definitions` and recursion, `pattern`, `minLength`, `maxLength`,
// `minimum`/`maximum`/`exclusiveMinimum`/`exclusiveMaximum` on integers and numbers (bounded
// numbers are written without an exponent), `format` date, time, date-time, uuid, email, ipv4,
// hostname, uri, uri-reference, byte (base64). A validation keyword outside this list is
// refused with an error naming it and where it is (never ignored); annotations (title,
// description, default, ...) and unknown keywords are ignored, as the specification says.
#pragma once

#include <cstddef>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "engine/grammar/grammar.h"

namespace pd::grammar {

struct JsonSchemaOptions {
  // Whitespace bytes allowed at each place JSON allows whitespace (0: compact output only).
  // Bounded so that a model cannot loop on spaces.
  int max_whitespace = 16;
  // Deepest schema nesting followed (subschema inside subschema).
  int max_depth = 128;
  // Largest grammar produced, in elements; a bigger one is refused.
  size_t max_elements = 2'000'000;
};

// Compiles the schema `schema_json` (a JSON document) into a grammar.
absl::StatusOr<Grammar> CompileJsonSchema(absl::string_view schema_json,
                                          const JsonSchemaOptions& options = {});

// The grammar of any JSON value (`response_format: {"type": "json_object"}` uses an object).
absl::StatusOr<Grammar> AnyJsonGrammar(bool object_only, const JsonSchemaOptions& options = {});

}  // namespace pd::grammar
