#include "engine/grammar/json_schema.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/status_macros.h"
#include "common/utf8/utf8.h"
#include "engine/grammar/matcher.h"
#include "engine/grammar/regex.h"
#include "nlohmann/json.hpp"

namespace pd::grammar {
namespace {

using Json = nlohmann::ordered_json;
using Seq = Grammar::Sequence;

// Keywords that only annotate. Unknown keywords are annotations too (the specification says
// so); this list only documents the common ones.
// Validation keywords this compiler enforces.
const std::set<std::string>& Supported() {
  static const auto* s = new std::set<std::string>{
      "type", "enum", "const", "properties", "required", "additionalProperties", "items",
      "prefixItems", "additionalItems", "minItems", "maxItems", "anyOf", "oneOf", "allOf", "$ref",
      "pattern", "minLength", "maxLength", "minimum", "maximum", "exclusiveMinimum",
      "exclusiveMaximum", "format", "$defs", "definitions", "minProperties", "maxProperties",
      "patternProperties", "dependencies", "dependentRequired", "dependentSchemas"};
  return *s;
}

// Validation keywords this compiler cannot enforce: a schema using one is refused.
const std::set<std::string>& Unsupported() {
  static const auto* s = new std::set<std::string>{
      "multipleOf", "uniqueItems", "contains", "minContains", "maxContains",
      "propertyNames", "not", "if", "then", "else", "unevaluatedItems",
      "unevaluatedProperties", "$dynamicRef", "$recursiveRef"};
  return *s;
}

// Escapes one code point as a canonical JSON string character.
std::string EscapeCodePoint(uint32_t cp) {
  switch (cp) {
    case '"': return "\\\"";
    case '\\': return "\\\\";
    case '\b': return "\\b";
    case '\f': return "\\f";
    case '\n': return "\\n";
    case '\r': return "\\r";
    case '\t': return "\\t";
    default: break;
  }
  return "";
}

const char* TypeName(const Json& v) {
  switch (v.type()) {
    case Json::value_t::null: return "null";
    case Json::value_t::boolean: return "boolean";
    case Json::value_t::number_integer:
    case Json::value_t::number_unsigned: return "integer";
    case Json::value_t::number_float: return "number";
    case Json::value_t::string: return "string";
    case Json::value_t::array: return "array";
    case Json::value_t::object: return "object";
    default: return "?";
  }
}

constexpr std::array<const char*, 7> kAllTypes = {"null", "boolean", "integer", "number",
                                                   "string", "array", "object"};

class SchemaCompiler {
 public:
  SchemaCompiler(const Json& root, const JsonSchemaOptions& options)
      : root_(root), options_(options) {}

  absl::StatusOr<Grammar> Run() {
    Init();
    PD_ASSIGN_OR_RETURN(const uint32_t top, Compile(root_, "#", 0));
    // No whitespace around the document: after its last byte only the end of output is left.
    const uint32_t root = g_.NewRule("root");
    g_.AddAlternative(root, {Grammar::Ref(top)});
    g_.set_root(root);
    PD_RETURN_IF_ERROR(CheckSize());
    PD_RETURN_IF_ERROR(g_.Validate());
    return std::move(g_);
  }

  absl::StatusOr<Grammar> RunAny(bool object_only) {
    Init();
    const uint32_t root = g_.NewRule("root");
    g_.AddAlternative(root, {Grammar::Ref(object_only ? any_object_ : any_value_)});
    g_.set_root(root);
    PD_RETURN_IF_ERROR(g_.Validate());
    return std::move(g_);
  }

 private:
  static absl::Status Error(absl::string_view path, absl::string_view what) {
    return absl::InvalidArgumentError(absl::StrCat("json schema at ", path, ": ", what));
  }
  // A (sub)schema no document satisfies. Inside anyOf, an optional property or items, it only
  // removes a choice; elsewhere it is the caller's error.
  static absl::Status Nothing(absl::string_view path, absl::string_view what) {
    return absl::OutOfRangeError(
        absl::StrCat("json schema at ", path, ": ", what, " (matches nothing)"));
  }
  static bool IsNothing(const absl::Status& s) { return absl::IsOutOfRange(s); }

  absl::Status CheckSize() const {
    if (g_.num_elements() > options_.max_elements) {
      return absl::InvalidArgumentError(absl::StrCat(
          "json schema compiles to a grammar over ", options_.max_elements, " elements"));
    }
    return absl::OkStatus();
  }

  void Init() {
    const uint32_t ws_char = g_.NewRule("ws_char");
    ByteSet ws;
    for (const char c : {' ', '\t', '\n', '\r'}) ws.set(static_cast<uint8_t>(c));
    g_.AddAlternative(ws_char, {g_.Bytes(ws)});
    ws_ = g_.AddRepeat("ws", ws_char, 0, options_.max_whitespace);
    comma_ = g_.NewRule("comma");
    g_.AddAlternative(comma_, {Grammar::Ref(ws_), g_.Byte(','), Grammar::Ref(ws_)});
    colon_ = g_.NewRule("colon");
    g_.AddAlternative(colon_, {Grammar::Ref(ws_), g_.Byte(':'), Grammar::Ref(ws_)});
    any_char_ = JsonChar({{0, 0x10FFFF}});
    const uint32_t chars = g_.AddRepeat("chars", any_char_, 0, -1);
    any_string_ = g_.NewRule("string");
    g_.AddAlternative(any_string_, Quoted(chars));
    const std::vector<CodePointRange> digit = {{'0', '9'}};
    digit_ = g_.AddCodePoints("digit", digit);
    digit19_ = g_.AddCodePoints("digit19", {{'1', '9'}});
    const uint32_t digits = g_.AddRepeat("digits", digit_, 1, -1);
    const uint32_t more_digits = g_.AddRepeat("digits0", digit_, 0, -1);
    more_digits_ = more_digits;
    const uint32_t nat = g_.NewRule("nat");
    g_.AddAlternative(nat, {g_.Byte('0')});
    g_.AddAlternative(nat, {Grammar::Ref(digit19_), Grammar::Ref(more_digits)});
    any_integer_ = g_.NewRule("integer");
    g_.AddAlternative(any_integer_, {Grammar::Ref(nat)});
    g_.AddAlternative(any_integer_, {g_.Byte('-'), Grammar::Ref(nat)});
    const uint32_t frac = g_.NewRule("frac");
    g_.AddAlternative(frac, {g_.Byte('.'), Grammar::Ref(digits)});
    g_.AddAlternative(frac, {});
    any_frac_ = frac;
    const uint32_t exp = g_.NewRule("exp");
    ByteSet e;
    e.set('e');
    e.set('E');
    ByteSet sign;
    sign.set('+');
    sign.set('-');
    g_.AddAlternative(exp, {g_.Bytes(e), Grammar::Ref(digits)});
    g_.AddAlternative(exp, {g_.Bytes(e), g_.Bytes(sign), Grammar::Ref(digits)});
    g_.AddAlternative(exp, {});
    any_number_ = g_.NewRule("number");
    g_.AddAlternative(any_number_,
                      {Grammar::Ref(any_integer_), Grammar::Ref(frac), Grammar::Ref(exp)});
    boolean_ = g_.AddChoice("boolean", {g_.Literal("true"), g_.Literal("false")});
    null_ = g_.AddChoice("null", {g_.Literal("null")});
    // Any value, recursively.
    any_value_ = g_.NewRule("value");
    any_object_ = g_.NewRule("object");
    const uint32_t any_array = g_.NewRule("array");
    const uint32_t member = g_.NewRule("member");
    g_.AddAlternative(member, {Grammar::Ref(any_string_), Grammar::Ref(colon_),
                               Grammar::Ref(any_value_)});
    const uint32_t more_members = g_.NewRule("members*");
    g_.AddAlternative(more_members,
                      {Grammar::Ref(comma_), Grammar::Ref(member), Grammar::Ref(more_members)});
    g_.AddAlternative(more_members, {});
    g_.AddAlternative(any_object_, {g_.Byte('{'), Grammar::Ref(ws_), g_.Byte('}')});
    g_.AddAlternative(any_object_, {g_.Byte('{'), Grammar::Ref(ws_), Grammar::Ref(member),
                                    Grammar::Ref(more_members), Grammar::Ref(ws_), g_.Byte('}')});
    const uint32_t more_values = g_.NewRule("values*");
    g_.AddAlternative(more_values,
                      {Grammar::Ref(comma_), Grammar::Ref(any_value_), Grammar::Ref(more_values)});
    g_.AddAlternative(more_values, {});
    g_.AddAlternative(any_array, {g_.Byte('['), Grammar::Ref(ws_), g_.Byte(']')});
    g_.AddAlternative(any_array, {g_.Byte('['), Grammar::Ref(ws_), Grammar::Ref(any_value_),
                                  Grammar::Ref(more_values), Grammar::Ref(ws_), g_.Byte(']')});
    for (const uint32_t r : {any_object_, any_array, any_string_, any_number_, boolean_, null_}) {
      g_.AddAlternative(any_value_, {Grammar::Ref(r)});
    }
    type_rule_ = {{"null", null_},          {"boolean", boolean_}, {"integer", any_integer_},
                  {"number", any_number_},  {"string", any_string_}, {"array", any_array},
                  {"object", any_object_}};
  }

  Seq Quoted(uint32_t content) {
    return {g_.Byte('"'), Grammar::Ref(content), g_.Byte('"')};
  }

  // One JSON string character out of `ranges`, canonically escaped. Cached by ranges.
  uint32_t JsonChar(const std::vector<CodePointRange>& ranges) {
    std::vector<std::pair<uint32_t, uint32_t>> key;
    for (const CodePointRange& r : ranges) key.emplace_back(r.lo, r.hi);
    auto it = char_cache_.find(key);
    if (it != char_cache_.end()) return it->second;
    std::vector<CodePointRange> raw;
    // Escapes, factored so that a character position is a few stacks, not one per escape
    // (34 for a string's every character): '\\' then one set of short forms, or "u00" then
    // the high hex digit (0 or 1) and a set of low ones.
    ByteSet short_escapes;
    std::array<ByteSet, 2> unicode_low;  // by the high hex digit
    auto add_escape = [&](uint32_t cp) {
      const std::string esc = EscapeCodePoint(cp);
      if (!esc.empty()) {
        short_escapes.set(static_cast<uint8_t>(esc[1]));
        return;
      }
      const uint32_t low = cp & 0xF;
      unicode_low[cp >> 4].set(static_cast<uint8_t>("0123456789abcdef"[low]));
      unicode_low[cp >> 4].set(static_cast<uint8_t>("0123456789ABCDEF"[low]));
    };
    for (const CodePointRange& r : NormalizeRanges(ranges)) {
      uint32_t lo = r.lo;
      // Code points below 0x20, '"' and '\\' are escaped; the rest are raw.
      for (uint32_t cp = lo; cp <= r.hi && cp < 0x20; ++cp) add_escape(cp);
      lo = std::max<uint32_t>(lo, 0x20);
      if (lo > r.hi) continue;
      for (const uint32_t special : {static_cast<uint32_t>('"'), static_cast<uint32_t>('\\')}) {
        if (lo <= special && special <= r.hi) add_escape(special);
      }
      // Split the raw part around '"' (0x22) and '\\' (0x5C).
      uint32_t start = lo;
      for (const uint32_t special : {0x22u, 0x5Cu}) {
        if (start <= special && special <= r.hi) {
          if (start < special) raw.push_back({start, special - 1});
          start = special + 1;
        }
      }
      if (start <= r.hi) raw.push_back({start, r.hi});
    }
    const uint32_t rule = g_.NewRule("char");
    if (!raw.empty()) {
      const uint32_t raw_rule = g_.AddCodePoints("raw", raw);
      g_.AddAlternative(rule, {Grammar::Ref(raw_rule)});
    }
    if (short_escapes.any() || unicode_low[0].any() || unicode_low[1].any()) {
      const uint32_t escape = g_.NewRule("escape");
      if (short_escapes.any()) g_.AddAlternative(escape, {g_.Bytes(short_escapes)});
      if (unicode_low[0].any() || unicode_low[1].any()) {
        const uint32_t code = g_.NewRule("escape_u00");
        for (uint8_t high = 0; high < 2; ++high) {
          if (unicode_low[high].any()) {
            g_.AddAlternative(code, {g_.Byte(static_cast<uint8_t>('0' + high)),
                                     g_.Bytes(unicode_low[high])});
          }
        }
        Seq u = g_.Literal("u00");
        u.push_back(Grammar::Ref(code));
        g_.AddAlternative(escape, std::move(u));
      }
      g_.AddAlternative(rule, {g_.Byte('\\'), Grammar::Ref(escape)});
    }
    char_cache_.emplace(std::move(key), rule);
    return rule;
  }

  // ---- $ref ----
  absl::StatusOr<const Json*> Resolve(const std::string& ref, absl::string_view path) const {
    if (ref.empty() || ref[0] != '#') {
      return Error(path, absl::StrCat("$ref '", ref, "' is not local (only '#...' refs)"));
    }
    std::string pointer = ref.substr(1);
    // Percent-decoding of the fragment (JSON pointers in URIs).
    std::string decoded;
    for (size_t i = 0; i < pointer.size(); ++i) {
      auto hex = [&](size_t k) {
        return std::isxdigit(static_cast<unsigned char>(pointer[k])) != 0;
      };
      if (pointer[i] == '%' && i + 2 < pointer.size() && hex(i + 1) && hex(i + 2)) {
        decoded += static_cast<char>(std::stoi(pointer.substr(i + 1, 2), nullptr, 16));
        i += 2;
      } else {
        decoded += pointer[i];
      }
    }
    if (!decoded.empty() && decoded[0] != '/') {
      return Error(path, absl::StrCat("$ref '", ref, "' (anchors are not supported)"));
    }
    const Json* node = &root_;
    size_t i = decoded.empty() ? std::string::npos : 1;
    while (i != std::string::npos && i <= decoded.size()) {
      const size_t slash = decoded.find('/', i);
      std::string token = decoded.substr(i, slash == std::string::npos ? std::string::npos : slash - i);
      std::string unescaped;
      for (size_t k = 0; k < token.size(); ++k) {
        if (token[k] == '~' && k + 1 < token.size()) {
          unescaped += token[k + 1] == '1' ? '/' : '~';
          ++k;
        } else {
          unescaped += token[k];
        }
      }
      if (node->is_object()) {
        auto it = node->find(unescaped);
        if (it == node->end()) return Error(path, absl::StrCat("$ref '", ref, "' not found"));
        node = &*it;
      } else if (node->is_array()) {
        char* end = nullptr;
        const long idx = std::strtol(unescaped.c_str(), &end, 10);
        if (unescaped.empty() || *end != '\0' || idx < 0 ||
            static_cast<size_t>(idx) >= node->size()) {
          return Error(path, absl::StrCat("$ref '", ref, "' not found"));
        }
        node = &(*node)[static_cast<size_t>(idx)];
      } else {
        return Error(path, absl::StrCat("$ref '", ref, "' not found"));
      }
      i = slash == std::string::npos ? std::string::npos : slash + 1;
    }
    return node;
  }

  absl::StatusOr<uint32_t> CompileRef(const std::string& ref, absl::string_view path, int depth) {
    auto it = ref_rules_.find(ref);
    if (it != ref_rules_.end()) return it->second;
    PD_ASSIGN_OR_RETURN(const Json* target, Resolve(ref, path));
    // The rule exists before its body is compiled, so recursion refers to it.
    const uint32_t rule = g_.NewRule(absl::StrCat("ref:", ref));
    ref_rules_.emplace(ref, rule);
    PD_ASSIGN_OR_RETURN(const uint32_t body, Compile(*target, ref, depth + 1));
    g_.AddAlternative(rule, {Grammar::Ref(body)});
    return rule;
  }

  // ---- merging (allOf, and siblings of anyOf/oneOf) ----
  // Merges `b` into `a` when the result means exactly "both"; otherwise an error.
  absl::Status Merge(Json* a, const Json& b, absl::string_view path, int depth) {
    if (depth > options_.max_depth) return Error(path, "schema nested too deeply");
    if (b.is_boolean()) {
      if (b.get<bool>()) return absl::OkStatus();
      return Nothing(path, "false schema in allOf");
    }
    if (!b.is_object()) return Error(path, "subschema is not an object");
    if (a->is_boolean()) *a = Json::object();
    Json bb = b;
    if (bb.contains("$ref")) {
      // Inline a reference unless it is recursive through this merge.
      const std::string ref = bb["$ref"].is_string() ? bb["$ref"].get<std::string>() : "";
      if (merging_refs_.count(ref) > 0) return Error(path, "recursive $ref inside allOf");
      PD_ASSIGN_OR_RETURN(const Json* target, Resolve(ref, path));
      bb.erase("$ref");
      merging_refs_.insert(ref);
      Json inlined = Json::object();
      absl::Status s = Merge(&inlined, *target, path, depth + 1);
      if (s.ok()) s = Merge(&inlined, bb, path, depth + 1);
      merging_refs_.erase(ref);
      PD_RETURN_IF_ERROR(s);
      bb = std::move(inlined);
    }
    if (bb.contains("allOf") && bb["allOf"].is_array()) {
      Json inner = bb["allOf"];
      bb.erase("allOf");
      for (const Json& sub : inner) PD_RETURN_IF_ERROR(Merge(&bb, sub, path, depth + 1));
    }
    // additionalProperties/items interact with properties/prefixItems of the same schema.
    auto has_props = [](const Json& s) {
      return s.contains("properties") || s.contains("patternProperties");
    };
    if ((a->contains("additionalProperties") && has_props(bb) &&
         (*a)["additionalProperties"] != Json(true)) ||
        (bb.contains("additionalProperties") && has_props(*a) &&
         bb["additionalProperties"] != Json(true))) {
      return Error(path, "allOf combining additionalProperties with another schema's properties");
    }
    for (auto it = bb.begin(); it != bb.end(); ++it) {
      const std::string& k = it.key();
      if (!a->contains(k)) {
        (*a)[k] = it.value();
        continue;
      }
      Json& av = (*a)[k];
      if (av == it.value()) continue;
      if (k == "required" && av.is_array() && it.value().is_array()) {
        for (const Json& r : it.value()) {
          if (std::find(av.begin(), av.end(), r) == av.end()) av.push_back(r);
        }
      } else if (k == "type") {
        std::vector<std::string> ta = Types(av);
        std::vector<std::string> tb = Types(it.value());
        Json both = Json::array();
        for (const std::string& t : ta) {
          if (std::find(tb.begin(), tb.end(), t) != tb.end()) {
            both.push_back(t);
          } else if (t == "number" && std::find(tb.begin(), tb.end(), "integer") != tb.end()) {
            both.push_back("integer");
          } else if (t == "integer" && std::find(tb.begin(), tb.end(), "number") != tb.end()) {
            both.push_back("integer");
          }
        }
        if (both.empty()) return Nothing(path, "allOf with types that do not intersect");
        av = both;
      } else if (k == "properties" && av.is_object() && it.value().is_object()) {
        for (auto p = it.value().begin(); p != it.value().end(); ++p) {
          if (!av.contains(p.key())) {
            av[p.key()] = p.value();
          } else if (av[p.key()] != p.value()) {
            Json merged = Json::object();
            PD_RETURN_IF_ERROR(Merge(&merged, av[p.key()], path, depth + 1));
            PD_RETURN_IF_ERROR(Merge(&merged, p.value(), path, depth + 1));
            av[p.key()] = std::move(merged);
          }
        }
      } else if (IsAnnotation(k)) {
        continue;
      } else if ((k == "minimum" || k == "minLength" || k == "minItems") && av.is_number() &&
                 it.value().is_number()) {
        av = std::max(av.get<double>(), it.value().get<double>());
      } else if ((k == "maximum" || k == "maxLength" || k == "maxItems") && av.is_number() &&
                 it.value().is_number()) {
        av = std::min(av.get<double>(), it.value().get<double>());
      } else {
        return Error(path, absl::StrCat("allOf with two different '", k, "'"));
      }
    }
    return absl::OkStatus();
  }

  static bool IsAnnotation(const std::string& k) {
    return Supported().count(k) == 0 && Unsupported().count(k) == 0;
  }

  static std::vector<std::string> Types(const Json& t) {
    std::vector<std::string> out;
    if (t.is_string()) out.push_back(t.get<std::string>());
    if (t.is_array()) {
      for (const Json& x : t) {
        if (x.is_string()) out.push_back(x.get<std::string>());
      }
    }
    return out;
  }

  // ---- the schema walk ----
  absl::StatusOr<uint32_t> Compile(const Json& schema, const std::string& path, int depth) {
    if (depth > options_.max_depth) return Error(path, "schema nested too deeply");
    PD_RETURN_IF_ERROR(CheckSize());
    if (schema.is_boolean()) {
      if (schema.get<bool>()) return any_value_;
      return Nothing(path, "schema 'false'");
    }
    if (!schema.is_object()) return Error(path, "a schema must be an object or a boolean");
    if (schema.contains("not")) {
      // Two forms are exact: `not: {}` / `not: true` (nothing), and `not` of types only.
      const Json& n = schema["not"];
      if (n == Json(true) || n == Json::object()) return Nothing(path, "'not' of everything");
      auto only = [&](const char* key) {
        if (!n.is_object() || !n.contains(key)) return false;
        for (auto it = n.begin(); it != n.end(); ++it) {
          if (it.key() != key && !IsAnnotation(it.key())) return false;
        }
        return true;
      };
      Json rest = schema;
      rest.erase("not");
      if (only("not")) {
        // not: {not: X} is X (with the rest of this schema).
        PD_RETURN_IF_ERROR(Merge(&rest, n["not"], absl::StrCat(path, "/not/not"), depth));
        return Compile(rest, path, depth + 1);
      }
      if (only("required") && n["required"].is_array() && n["required"].size() == 1 &&
          n["required"][0].is_string()) {
        // not: {required: [p]}: an object (`required` holds for anything else) without p.
        const std::string name = n["required"][0].get<std::string>();
        if (rest.contains("type")) {
          const std::vector<std::string> types = Types(rest["type"]);
          if (std::find(types.begin(), types.end(), "object") == types.end()) {
            return Nothing(path, "'not' of 'required' on a schema that is no object");
          }
        }
        rest["type"] = "object";
        if (rest.contains("required") && rest["required"].is_array() &&
            std::find(rest["required"].begin(), rest["required"].end(), Json(name)) !=
                rest["required"].end()) {
          return Nothing(path, absl::StrCat("property '", name, "' both required and not"));
        }
        ForbidProperty(&rest, name);
        return Compile(rest, path, depth + 1);
      }
      bool types_only = n.is_object() && n.contains("type");
      if (types_only) {
        for (auto it = n.begin(); it != n.end(); ++it) {
          if (it.key() != "type" && !IsAnnotation(it.key())) types_only = false;
        }
      }
      std::vector<std::string> banned = types_only ? Types(n["type"]) : std::vector<std::string>{};
      const bool bans_integer_only =
          std::find(banned.begin(), banned.end(), "integer") != banned.end() &&
          std::find(banned.begin(), banned.end(), "number") == banned.end();
      if (!types_only || bans_integer_only) {
        return Error(path, "keyword 'not' is not supported (only of {}, of types, of 'not', or "
                           "of one required property)");
      }
      Json allowed = Json::array();
      for (const char* t : kAllTypes) {
        const std::string type(t);
        const bool out = std::find(banned.begin(), banned.end(), type) != banned.end() ||
                         (type == "integer" &&
                          std::find(banned.begin(), banned.end(), "number") != banned.end());
        if (!out) allowed.push_back(type);
      }
      if (allowed.empty()) return Nothing(path, "'not' of every type");
      Json merged = Json::object();
      merged["type"] = allowed;
      PD_RETURN_IF_ERROR(Merge(&merged, rest, path, depth));
      return Compile(merged, path, depth + 1);
    }
    for (auto it = schema.begin(); it != schema.end(); ++it) {
      if (Unsupported().count(it.key()) > 0) {
        return Error(path, absl::StrCat("keyword '", it.key(), "' is not supported"));
      }
    }
    for (const char* key : {"dependencies", "dependentRequired", "dependentSchemas"}) {
      if (schema.contains(key)) return CompileDependency(schema, key, path, depth);
    }
    if (schema.contains("allOf")) {
      const Json& all = schema["allOf"];
      if (!all.is_array() || all.empty()) return Error(path, "allOf must be a non-empty array");
      Json merged = schema;
      merged.erase("allOf");
      for (size_t i = 0; i < all.size(); ++i) {
        PD_RETURN_IF_ERROR(Merge(&merged, all[i], absl::StrCat(path, "/allOf/", i), depth));
      }
      return Compile(merged, path, depth + 1);
    }
    if (schema.contains("$ref")) {
      if (!schema["$ref"].is_string()) return Error(path, "$ref must be a string");
      const std::string ref = schema["$ref"].get<std::string>();
      bool siblings = false;
      for (auto it = schema.begin(); it != schema.end(); ++it) {
        if (it.key() != "$ref" && it.key() != "$defs" && it.key() != "definitions" &&
            !IsAnnotation(it.key())) {
          siblings = true;
        }
      }
      if (!siblings) return CompileRef(ref, path, depth);
      Json merged = schema;
      merged.erase("$ref");
      Json target = Json::object();
      PD_RETURN_IF_ERROR(Merge(&target, Json{{"$ref", ref}}, path, depth));
      PD_RETURN_IF_ERROR(Merge(&target, merged, path, depth));
      return Compile(target, path, depth + 1);
    }
    for (const char* key : {"anyOf", "oneOf"}) {
      if (!schema.contains(key)) continue;
      const Json& branches = schema[key];
      if (!branches.is_array() || branches.empty()) {
        return Error(path, absl::StrCat(key, " must be a non-empty array"));
      }
      Json rest = schema;
      rest.erase(key);
      bool has_rest = false;
      for (auto it = rest.begin(); it != rest.end(); ++it) {
        if (!IsAnnotation(it.key()) && it.key() != "$defs" && it.key() != "definitions") {
          has_rest = true;
        }
      }
      if (std::string(key) == "oneOf") PD_RETURN_IF_ERROR(CheckDisjoint(branches, rest, path));
      std::vector<Seq> alts;
      for (size_t i = 0; i < branches.size(); ++i) {
        const std::string bpath = absl::StrCat(path, "/", key, "/", i);
        absl::StatusOr<uint32_t> rule;
        if (has_rest) {
          Json merged = rest;
          absl::Status s = Merge(&merged, branches[i], bpath, depth);
          if (!s.ok()) return s;
          rule = Compile(merged, bpath, depth + 1);
        } else {
          rule = Compile(branches[i], bpath, depth + 1);
        }
        if (!rule.ok()) {
          // A branch that matches nothing drops out; any other error is the schema's.
          if (IsNothing(rule.status())) continue;
          return rule.status();
        }
        alts.push_back({Grammar::Ref(*rule)});
      }
      if (alts.empty()) return Nothing(path, absl::StrCat(key, ": every branch"));
      return g_.AddChoice(key, std::move(alts));
    }
    if (schema.contains("const")) return Literal(schema["const"]);
    std::vector<std::string> types;
    if (schema.contains("type")) {
      types = Types(schema["type"]);
      if (types.empty()) return Error(path, "type must be a string or an array of strings");
      for (const std::string& t : types) {
        if (type_rule_.count(t) == 0) return Error(path, absl::StrCat("unknown type '", t, "'"));
      }
    } else {
      types.assign(kAllTypes.begin(), kAllTypes.end());
    }
    if (schema.contains("enum")) {
      const Json& values = schema["enum"];
      if (!values.is_array()) return Error(path, "enum must be an array");
      std::vector<Seq> alts;
      for (const Json& v : values) {
        std::string t = TypeName(v);
        const bool ok = std::find(types.begin(), types.end(), t) != types.end() ||
                        (t == "integer" &&
                         std::find(types.begin(), types.end(), "number") != types.end());
        if (ok) alts.push_back({Grammar::Ref(Literal(v))});
      }
      if (alts.empty()) return Nothing(path, "enum: no value has the type");
      return g_.AddChoice("enum", std::move(alts));
    }
    // "number" includes the integers: compile it once.
    if (std::find(types.begin(), types.end(), "number") != types.end()) {
      types.erase(std::remove(types.begin(), types.end(), "integer"), types.end());
    }
    std::vector<Seq> alts;
    for (const std::string& t : types) {
      PD_ASSIGN_OR_RETURN(const uint32_t r, CompileType(t, schema, path, depth));
      alts.push_back({Grammar::Ref(r)});
    }
    if (alts.size() == 1) return alts[0][0].index;
    return g_.AddChoice("types", std::move(alts));
  }

  // `name` may not appear in the object `schema` describes, additionalProperties or not.
  static void ForbidProperty(Json* schema, const std::string& name) {
    if (!schema->contains("properties") || !(*schema)["properties"].is_object()) {
      (*schema)["properties"] = Json::object();
    }
    (*schema)["properties"][name] = false;
  }

  // A property dependency ("dependencies"/"dependentRequired": a name whose presence requires
  // others; "dependencies"/"dependentSchemas": one whose presence requires a schema) splits
  // the schema in two that cannot overlap: the trigger absent, or present (an object) with
  // what it requires. One dependency at a time, at most kMaxDependencies per schema (each
  // doubles the object's grammar).
  absl::StatusOr<uint32_t> CompileDependency(const Json& schema, const char* key,
                                             const std::string& path, int depth) {
    constexpr size_t kMaxDependencies = 4;
    const Json& deps = schema[key];
    if (!deps.is_object()) return Error(path, absl::StrCat(key, " must be an object"));
    size_t total = 0;
    for (const char* k : {"dependencies", "dependentRequired", "dependentSchemas"}) {
      if (schema.contains(k) && schema[k].is_object()) total += schema[k].size();
    }
    if (total > kMaxDependencies) {
      return Error(path, absl::StrCat("more than ", kMaxDependencies,
                                      " property dependencies are not supported"));
    }
    Json rest = schema;
    if (deps.empty()) {
      rest.erase(key);
      return Compile(rest, path, depth + 1);
    }
    const std::string trigger = deps.begin().key();
    const Json what = deps.begin().value();
    rest[key].erase(trigger);
    if (rest[key].empty()) rest.erase(key);
    const std::string dpath = absl::StrCat(path, "/", key, "/", trigger);
    // Present: an object with the trigger and what it requires.
    Json present = rest;
    if (present.contains("type")) {
      const std::vector<std::string> types = Types(present["type"]);
      if (std::find(types.begin(), types.end(), "object") == types.end()) {
        return Compile(rest, path, depth + 1);  // no object: the dependency never applies
      }
    }
    present["type"] = "object";
    if (!present.contains("required") || !present["required"].is_array()) {
      present["required"] = Json::array();
    }
    auto require = [&](const std::string& name) {
      Json& r = present["required"];
      if (std::find(r.begin(), r.end(), Json(name)) == r.end()) r.push_back(name);
    };
    require(trigger);
    const bool trigger_required =
        rest.contains("required") && rest["required"].is_array() &&
        std::find(rest["required"].begin(), rest["required"].end(), Json(trigger)) !=
            rest["required"].end();
    absl::Status merged = absl::OkStatus();
    if (what.is_array()) {
      if (std::string(key) == "dependentSchemas") {
        return Error(dpath, "dependentSchemas values must be schemas");
      }
      for (const Json& name : what) {
        if (!name.is_string()) return Error(dpath, "a property dependency lists names");
        require(name.get<std::string>());
      }
    } else {
      if (std::string(key) == "dependentRequired") {
        return Error(dpath, "dependentRequired values must be arrays of names");
      }
      merged = Merge(&present, what, dpath, depth);
      if (!merged.ok() && !IsNothing(merged)) return merged;
    }
    // Absent: the trigger may not appear.
    Json absent = rest;
    ForbidProperty(&absent, trigger);
    std::vector<Seq> alts;
    for (Json* variant : {&absent, &present}) {
      if (variant == &present && !merged.ok()) continue;
      if (variant == &absent && trigger_required) continue;
      absl::StatusOr<uint32_t> r = Compile(*variant, path, depth + 1);
      if (!r.ok()) {
        if (IsNothing(r.status())) continue;
        return r.status();
      }
      alts.push_back({Grammar::Ref(*r)});
    }
    if (alts.empty()) return Nothing(path, absl::StrCat(key, ": '", trigger, "' either way"));
    return g_.AddChoice("dependency", std::move(alts));
  }

  // oneOf is exact only when no document can match two branches. Two branches are disjoint
  // when the JSON types (or constants) they accept are, or when they are objects told apart by
  // a member: one both require whose values are different constants (a tagged union: "type":
  // {"const": "circle"}), or one that a branch requires and the other forbids (`false`, or
  // not among its properties with additionalProperties false). `rest` is the schema around
  // the oneOf (its siblings), which applies to every branch.
  absl::Status CheckDisjoint(const Json& branches, const Json& rest, absl::string_view path) {
    const absl::Status overlap =
        Error(path, "oneOf whose branches may overlap is not supported (use anyOf)");
    auto deref = [&](const Json& j) -> const Json& {
      if (j.is_object() && j.contains("$ref") && j["$ref"].is_string()) {
        absl::StatusOr<const Json*> t = Resolve(j["$ref"].get<std::string>(), path);
        if (t.ok()) return **t;
      }
      return j;
    };
    std::vector<std::set<std::string>> sets;
    std::vector<const Json*> nodes;
    for (const Json& b : branches) {
      std::set<std::string> s;
      const Json* node = &deref(b);
      const Json* typed = node->is_object() && node->contains("type") ? node
                          : rest.is_object() && rest.contains("type") &&
                                  !(node->is_object() &&
                                    (node->contains("const") || node->contains("enum")))
                              ? &rest
                              : nullptr;
      if (typed != nullptr) {
        for (const std::string& t : Types((*typed)["type"])) s.insert(t);
        if (s.count("number") > 0) s.insert("integer");
      } else if (node->is_object() && node->contains("const")) {
        s.insert(absl::StrCat("=", TypeName((*node)["const"]), ":", (*node)["const"].dump()));
      } else if (node->is_object() && node->contains("enum") && (*node)["enum"].is_array()) {
        for (const Json& v : (*node)["enum"]) {
          s.insert(absl::StrCat("=", TypeName(v), ":", v.dump()));
        }
      } else {
        return overlap;
      }
      sets.push_back(std::move(s));
      nodes.push_back(node);
    }
    // A constant overlaps a type set holding its type ("=integer:5" and "integer").
    auto overlaps = [](const std::set<std::string>& a, const std::set<std::string>& b,
                       bool but_objects) {
      for (const std::string& t : a) {
        if (but_objects && t == "object") continue;
        if (b.count(t) > 0) return true;
        if (t[0] == '=' && b.count(t.substr(1, t.find(':') - 1)) > 0) return true;
        // 5.0 is an integer too, in JSON Schema.
        if (absl::StartsWith(t, "=number:") && b.count("integer") > 0) return true;
      }
      return false;
    };
    // The member schema `name` of a branch (its own, else the siblings'); null when none.
    auto member = [&](const Json& node, const std::string& name) -> const Json* {
      for (const Json* scope : {&node, &rest}) {
        if (scope->is_object() && scope->contains("properties") &&
            (*scope)["properties"].is_object() && (*scope)["properties"].contains(name)) {
          return &deref((*scope)["properties"][name]);
        }
      }
      return nullptr;
    };
    auto required = [&](const Json& node) {
      std::set<std::string> names;
      for (const Json* scope : {&node, &rest}) {
        if (!scope->is_object() || !scope->contains("required")) continue;
        for (const Json& r : (*scope)["required"]) {
          if (r.is_string()) names.insert(r.get<std::string>());
        }
      }
      return names;
    };
    // The values a member schema allows, when finitely many (const or enum).
    auto values = [](const Json* m) -> std::optional<std::vector<Json>> {
      if (m == nullptr || !m->is_object()) return std::nullopt;
      if (m->contains("const")) return std::vector<Json>{(*m)["const"]};
      if (m->contains("enum") && (*m)["enum"].is_array()) {
        return std::vector<Json>((*m)["enum"].begin(), (*m)["enum"].end());
      }
      return std::nullopt;
    };
    auto forbids = [&](const Json& node, const std::string& name) {
      const Json* m = member(node, name);
      if (m != nullptr) return *m == Json(false);
      // Not among its properties: forbidden when nothing else may appear.
      return node.is_object() && node.value("additionalProperties", Json(true)) == Json(false) &&
             !node.contains("patternProperties") &&
             !(rest.is_object() && (rest.contains("properties") ||
                                    rest.contains("patternProperties")));
    };
    auto objects_disjoint = [&](const Json& a, const Json& b) {
      const std::set<std::string> ra = required(a), rb = required(b);
      for (const std::string& name : ra) {
        if (forbids(b, name)) return true;
        if (rb.count(name) == 0) continue;
        std::optional<std::vector<Json>> va = values(member(a, name));
        std::optional<std::vector<Json>> vb = values(member(b, name));
        if (!va || !vb) continue;
        bool shared = false;
        for (const Json& x : *va) {
          for (const Json& y : *vb) shared = shared || x == y;
        }
        if (!shared) return true;
      }
      for (const std::string& name : rb) {
        if (forbids(a, name)) return true;
      }
      return false;
    };
    for (size_t i = 0; i < sets.size(); ++i) {
      for (size_t j = i + 1; j < sets.size(); ++j) {
        if (!overlaps(sets[i], sets[j], false) && !overlaps(sets[j], sets[i], false)) continue;
        // Only objects in common: told apart by a member?
        const bool only_objects =
            !overlaps(sets[i], sets[j], true) && !overlaps(sets[j], sets[i], true);
        if (only_objects && objects_disjoint(*nodes[i], *nodes[j])) continue;
        return overlap;
      }
    }
    return absl::OkStatus();
  }

  uint32_t Literal(const Json& value) {
    const std::string text = value.dump();
    auto it = literal_cache_.find(text);
    if (it != literal_cache_.end()) return it->second;
    const uint32_t rule = g_.AddChoice("literal", {g_.Literal(text)});
    literal_cache_.emplace(text, rule);
    return rule;
  }

  static std::optional<double> Number(const Json& s, const char* key) {
    if (!s.contains(key) || !s[key].is_number()) return std::nullopt;
    return s[key].get<double>();
  }

  absl::StatusOr<uint32_t> CompileType(const std::string& type, const Json& s,
                                       const std::string& path, int depth) {
    if (type == "null") return null_;
    if (type == "boolean") return boolean_;
    if (type == "integer" || type == "number") return CompileNumber(type, s, path);
    if (type == "string") return CompileString(s, path);
    if (type == "array") return CompileArray(s, path, depth);
    return CompileObject(s, path, depth);
  }

  absl::StatusOr<uint32_t> CompileNumber(const std::string& type, const Json& s,
                                         const std::string& path) {
    std::optional<double> lo = Number(s, "minimum");
    std::optional<double> hi = Number(s, "maximum");
    bool lo_exclusive = false;
    bool hi_exclusive = false;
    if (s.contains("exclusiveMinimum")) {
      if (s["exclusiveMinimum"].is_boolean()) {
        lo_exclusive = s["exclusiveMinimum"].get<bool>();
      } else if (auto v = Number(s, "exclusiveMinimum")) {
        if (!lo || *v >= *lo) {
          lo = v;
          lo_exclusive = true;
        }
      }
    }
    if (s.contains("exclusiveMaximum")) {
      if (s["exclusiveMaximum"].is_boolean()) {
        hi_exclusive = s["exclusiveMaximum"].get<bool>();
      } else if (auto v = Number(s, "exclusiveMaximum")) {
        if (!hi || *v <= *hi) {
          hi = v;
          hi_exclusive = true;
        }
      }
    }
    if (!lo && !hi) return type == "integer" ? any_integer_ : any_number_;
    if (type == "number") return NumberRange(lo, lo_exclusive, hi, hi_exclusive, path);
    constexpr double kLimit = 9e15;
    std::optional<int64_t> ilo;
    std::optional<int64_t> ihi;
    if (lo) {
      if (std::abs(*lo) > kLimit) return Error(path, "minimum out of range");
      double v = std::ceil(*lo);
      if (lo_exclusive && v == *lo) v += 1;
      ilo = static_cast<int64_t>(v);
    }
    if (hi) {
      if (std::abs(*hi) > kLimit) return Error(path, "maximum out of range");
      double v = std::floor(*hi);
      if (hi_exclusive && v == *hi) v -= 1;
      ihi = static_cast<int64_t>(v);
    }
    if (ilo && ihi && *ilo > *ihi) return Nothing(path, "integer range is empty");
    return IntegerRange(ilo, ihi);
  }

  // A non-negative decimal: integer part and fraction digits (no trailing zeros).
  struct Decimal {
    uint64_t whole = 0;
    std::string frac;
  };

  static int Compare(const Decimal& a, const Decimal& b) {
    if (a.whole != b.whole) return a.whole < b.whole ? -1 : 1;
    const size_t n = std::max(a.frac.size(), b.frac.size());
    for (size_t i = 0; i < n; ++i) {
      const char x = i < a.frac.size() ? a.frac[i] : '0';
      const char y = i < b.frac.size() ? b.frac[i] : '0';
      if (x != y) return x < y ? -1 : 1;
    }
    return 0;
  }

  // `v` as the decimal its shortest round-trip text writes (0.1 is 0.1, as the schema wrote
  // it), with its sign apart; nullopt when it is out of the supported range.
  static std::optional<std::pair<bool, Decimal>> ToDecimal(double v) {
    if (!std::isfinite(v) || std::abs(v) > 9e15) return std::nullopt;
    char buf[64];
    const std::to_chars_result r = std::to_chars(buf, buf + sizeof(buf), v);
    if (r.ec != std::errc()) return std::nullopt;
    std::string text(buf, r.ptr);
    const bool negative = !text.empty() && text[0] == '-';
    if (negative) text.erase(0, 1);
    int exponent = 0;
    if (const size_t e = text.find_first_of("eE"); e != std::string::npos) {
      exponent = std::atoi(text.c_str() + e + 1);
      text.resize(e);
    }
    std::string digits = text;
    int point = static_cast<int>(text.size());
    if (const size_t dot = text.find('.'); dot != std::string::npos) {
      digits = text.substr(0, dot) + text.substr(dot + 1);
      point = static_cast<int>(dot);
    }
    point += exponent;
    if (point < -40 || point > 16) return std::nullopt;
    std::string whole, frac;
    if (point <= 0) {
      frac = std::string(static_cast<size_t>(-point), '0') + digits;
    } else if (static_cast<size_t>(point) >= digits.size()) {
      whole = digits + std::string(static_cast<size_t>(point) - digits.size(), '0');
    } else {
      whole = digits.substr(0, static_cast<size_t>(point));
      frac = digits.substr(static_cast<size_t>(point));
    }
    while (!frac.empty() && frac.back() == '0') frac.pop_back();
    if (frac.size() > 40) return std::nullopt;
    Decimal d;
    for (const char c : whole) d.whole = d.whole * 10 + static_cast<uint64_t>(c - '0');
    d.frac = std::move(frac);
    return std::make_pair(negative && (d.whole != 0 || !d.frac.empty()), d);
  }

  // Numbers of type 'number' in a range, written without an exponent:
  // -?(0|[1-9][0-9]*)(\.[0-9]+)? whose value is in [lo, hi] (either end open when exclusive,
  // absent when unbounded). Exact: digit by digit against the bounds' decimal expansions.
  absl::StatusOr<uint32_t> NumberRange(std::optional<double> lo, bool lo_exclusive,
                                       std::optional<double> hi, bool hi_exclusive,
                                       const std::string& path) {
    std::optional<std::pair<bool, Decimal>> l, h;
    if (lo) {
      l = ToDecimal(*lo);
      if (!l) return Error(path, "minimum out of range (|x| <= 9e15, 40 fraction digits)");
    }
    if (hi) {
      h = ToDecimal(*hi);
      if (!h) return Error(path, "maximum out of range (|x| <= 9e15, 40 fraction digits)");
    }
    const Decimal zero;
    const uint32_t rule = g_.NewRule("number_range");
    bool any = false;
    // x >= 0: [max(lo, 0), hi].
    const bool hi_negative = h && h->first;
    const bool hi_zero_open = h && !h->first && Compare(h->second, zero) == 0 && hi_exclusive;
    if (!hi_negative && !hi_zero_open) {
      const bool lo_positive = l && !l->first;
      std::optional<Decimal> upper;
      if (h) upper = h->second;
      if (std::optional<uint32_t> r = MagnitudeRange(lo_positive ? l->second : zero,
                                                     lo_positive && lo_exclusive, upper,
                                                     hi_exclusive)) {
        g_.AddAlternative(rule, {Grammar::Ref(*r)});
        any = true;
      }
    }
    // x < 0: -y with y in (0 or -hi, -lo].
    const bool lo_nonnegative = l && !l->first;
    if (!lo_nonnegative) {
      std::optional<Decimal> upper;
      if (l) upper = l->second;
      const Decimal lower = hi_negative ? h->second : zero;
      if (std::optional<uint32_t> r =
              MagnitudeRange(lower, hi_negative ? hi_exclusive : true, upper, lo_exclusive)) {
        g_.AddAlternative(rule, {g_.Byte('-'), Grammar::Ref(*r)});
        any = true;
      }
    }
    if (!any) return Nothing(path, "number range is empty");
    return rule;
  }

  // Non-negative decimals in [lo, hi] (ends open when `*_open`; no hi: unbounded), as
  // (0|[1-9][0-9]*)(\.[0-9]+)?; nullopt when there is none.
  std::optional<uint32_t> MagnitudeRange(const Decimal& lo, bool lo_open,
                                         const std::optional<Decimal>& hi, bool hi_open) {
    if (hi) {
      const int c = Compare(lo, *hi);
      if (c > 0 || (c == 0 && (lo_open || hi_open))) return std::nullopt;
    }
    FracBuilder fb{this, lo.frac, lo_open, hi ? hi->frac : std::string(), hi_open, {}};
    const uint32_t rule = g_.NewRule("magnitude");
    bool any = false;
    auto with_fraction = [&](const std::string& whole, bool tight_lo, bool tight_hi) {
      std::optional<uint32_t> frac = fb.Top(tight_lo, tight_hi);
      if (!frac) return;
      Seq seq = g_.Literal(whole);
      seq.push_back(Grammar::Ref(*frac));
      g_.AddAlternative(rule, std::move(seq));
      any = true;
    };
    if (hi && lo.whole == hi->whole) {
      with_fraction(std::to_string(lo.whole), true, true);
    } else {
      with_fraction(std::to_string(lo.whole), true, false);
      if (!hi || hi->whole - lo.whole >= 2) {
        std::optional<uint64_t> top;
        if (hi) top = hi->whole - 1;
        g_.AddAlternative(rule, {Grammar::Ref(NaturalRange(lo.whole + 1, top)),
                                 Grammar::Ref(any_frac_)});
        any = true;
      }
      if (hi) with_fraction(std::to_string(hi->whole), false, true);
    }
    if (!any) return std::nullopt;
    return rule;
  }

  // The fraction digits after an integer part equal to a bound's: a digit-by-digit automaton
  // whose state is (position, still equal to lo's digits, still equal to hi's digits).
  struct FracBuilder {
    SchemaCompiler* c;
    std::string lo;  // lo's fraction digits (no trailing zeros)
    bool lo_open;
    std::string hi;
    bool hi_open;
    std::map<std::tuple<size_t, bool, bool>, uint32_t> rules;

    size_t End() const { return std::max(lo.size(), hi.size()); }
    char LoDigit(size_t i) const { return i < lo.size() ? lo[i] : '0'; }
    char HiDigit(size_t i) const { return i < hi.size() ? hi[i] : '0'; }
    // The digits so far may be the whole fraction.
    bool CanEnd(size_t i, bool tl, bool th) const {
      const bool lo_ok = !tl || (i >= lo.size() && !lo_open);  // equal to lo: closed end only
      const bool hi_ok = !th || i < hi.size() || !hi_open;     // below hi, or equal and closed
      return lo_ok && hi_ok;
    }
    // Some continuation of the digits so far is in range.
    bool Viable(size_t i, bool tl, bool th) const {
      if (CanEnd(i, tl, th)) return true;
      if (i >= End()) return !th;  // past both: only zeros keep hi tight, and they never end
      const char l = tl ? LoDigit(i) : '0';
      const char h = th ? HiDigit(i) : '9';
      for (char d = l; d <= h; ++d) {
        if (Viable(i + 1, tl && d == l, th && d == h)) return true;
      }
      return false;
    }
    // The digit alternatives from a state, grouped by the state they lead to.
    std::vector<Seq> Steps(size_t i, bool tl, bool th) {
      std::map<std::pair<bool, bool>, ByteSet> groups;
      const char l = tl ? LoDigit(i) : '0';
      const char h = th ? HiDigit(i) : '9';
      for (char d = l; d <= h; ++d) {
        const bool ntl = tl && d == l, nth = th && d == h;
        if (Viable(i + 1, ntl, nth)) groups[{ntl, nth}].set(static_cast<uint8_t>(d));
      }
      std::vector<Seq> out;
      for (const auto& [next, set] : groups) {
        out.push_back({c->g_.Bytes(set), Grammar::Ref(Rest(i + 1, next.first, next.second))});
      }
      return out;
    }
    // Digits (possibly none) that complete a fraction from a state.
    uint32_t Rest(size_t i, bool tl, bool th) {
      i = std::min(i, End());
      if (!tl && !th) return c->more_digits_;
      const auto key = std::make_tuple(i, tl, th);
      if (auto it = rules.find(key); it != rules.end()) return it->second;
      const uint32_t rule = c->g_.NewRule("frac_digits");
      rules.emplace(key, rule);
      if (CanEnd(i, tl, th)) c->g_.AddAlternative(rule, {});
      for (Seq& seq : Steps(i, tl, th)) c->g_.AddAlternative(rule, std::move(seq));
      return rule;
    }
    // The fraction after an integer part equal to lo's (tl) and/or hi's (th): none, or '.'
    // and at least one digit; nullopt when nothing fits.
    std::optional<uint32_t> Top(bool tl, bool th) {
      if (!tl && !th) return c->any_frac_;
      if (!Viable(0, tl, th)) return std::nullopt;
      const uint32_t rule = c->g_.NewRule("frac_range");
      if (CanEnd(0, tl, th)) c->g_.AddAlternative(rule, {});
      for (Seq& seq : Steps(0, tl, th)) {
        seq.insert(seq.begin(), c->g_.Byte('.'));
        c->g_.AddAlternative(rule, std::move(seq));
      }
      return rule;
    }
  };

  // Decimal digits of `a`..`b` (same length, no leading-zero rule: the caller handles it).
  uint32_t SameLength(const std::string& a, const std::string& b) {
    const uint32_t rule = g_.NewRule("digits");
    if (a.empty()) {
      g_.AddAlternative(rule, {});
      return rule;
    }
    if (a[0] == b[0]) {
      g_.AddAlternative(rule, {g_.Byte(static_cast<uint8_t>(a[0])),
                               Grammar::Ref(SameLength(a.substr(1), b.substr(1)))});
      return rule;
    }
    const std::string nines(a.size() - 1, '9');
    const std::string zeros(a.size() - 1, '0');
    auto range = [&](char x, char y) {
      ByteSet set;
      for (char c = x; c <= y; ++c) set.set(static_cast<uint8_t>(c));
      return g_.Bytes(set);
    };
    g_.AddAlternative(rule, {g_.Byte(static_cast<uint8_t>(a[0])),
                             Grammar::Ref(SameLength(a.substr(1), nines))});
    if (a[0] + 1 <= b[0] - 1) {
      Seq seq{range(static_cast<char>(a[0] + 1), static_cast<char>(b[0] - 1))};
      for (size_t i = 1; i < a.size(); ++i) seq.push_back(Grammar::Ref(digit_));
      g_.AddAlternative(rule, std::move(seq));
    }
    g_.AddAlternative(rule, {g_.Byte(static_cast<uint8_t>(b[0])),
                             Grammar::Ref(SameLength(zeros, b.substr(1)))});
    return rule;
  }

  // Natural numbers in [lo, hi] (hi empty: unbounded), canonical decimal.
  uint32_t NaturalRange(uint64_t lo, std::optional<uint64_t> hi) {
    const uint32_t rule = g_.NewRule("nat_range");
    std::string lo_s = std::to_string(lo);
    const size_t max_len = hi ? std::to_string(*hi).size() : lo_s.size();
    for (size_t len = lo_s.size(); len <= max_len; ++len) {
      const std::string first = len == lo_s.size() ? lo_s : "1" + std::string(len - 1, '0');
      const std::string last =
          hi && len == max_len ? std::to_string(*hi) : std::string(len, '9');
      if (len == 1 && first == "0") {
        if (last == "0") {
          g_.AddAlternative(rule, {g_.Byte('0')});
        } else {
          g_.AddAlternative(rule, {g_.Byte('0')});
          g_.AddAlternative(rule, {Grammar::Ref(SameLength("1", last))});
        }
        continue;
      }
      g_.AddAlternative(rule, {Grammar::Ref(SameLength(first, last))});
    }
    if (!hi) {
      // Every longer number: [1-9] followed by at least max_len digits.
      Seq seq{Grammar::Ref(digit19_)};
      for (size_t i = 0; i < max_len; ++i) seq.push_back(Grammar::Ref(digit_));
      seq.push_back(Grammar::Ref(g_.AddRepeat("digits", digit_, 0, -1)));
      g_.AddAlternative(rule, std::move(seq));
    }
    return rule;
  }

  uint32_t IntegerRange(std::optional<int64_t> lo, std::optional<int64_t> hi) {
    const uint32_t rule = g_.NewRule("int_range");
    // Non-negative part.
    if (!hi || *hi >= 0) {
      const uint64_t a = lo && *lo > 0 ? static_cast<uint64_t>(*lo) : 0;
      std::optional<uint64_t> b;
      if (hi) b = static_cast<uint64_t>(*hi);
      g_.AddAlternative(rule, {Grammar::Ref(NaturalRange(a, b))});
    }
    // Negative part: -k with k in [max(1, -hi), -lo].
    if (!lo || *lo < 0) {
      const uint64_t a = hi && *hi < 0 ? static_cast<uint64_t>(-*hi) : 1;
      std::optional<uint64_t> b;
      if (lo) b = static_cast<uint64_t>(-*lo);
      g_.AddAlternative(rule, {g_.Byte('-'), Grammar::Ref(NaturalRange(a, b))});
    }
    return rule;
  }

  absl::StatusOr<uint32_t> CompileString(const Json& s, const std::string& path) {
    std::optional<double> min_len = Number(s, "minLength");
    std::optional<double> max_len = Number(s, "maxLength");
    const bool has_pattern = s.contains("pattern");
    const bool has_format = s.contains("format");
    RegexOptions ropts;
    ropts.char_class = [this](Grammar*, const std::vector<CodePointRange>& r) {
      return JsonChar(r);
    };
    if (has_pattern || has_format) {
      if ((has_pattern && has_format) || min_len || max_len) {
        return Error(path, "pattern/format together with another string constraint is not "
                           "supported");
      }
      std::string regex;
      if (has_pattern) {
        if (!s["pattern"].is_string()) return Error(path, "pattern must be a string");
        regex = s["pattern"].get<std::string>();
        ropts.search = true;
      } else {
        if (!s["format"].is_string()) return Error(path, "format must be a string");
        PD_ASSIGN_OR_RETURN(regex, FormatRegex(s["format"].get<std::string>(), path));
      }
      absl::StatusOr<uint32_t> body = CompileRegex(regex, ropts, &g_);
      if (!body.ok()) {
        return Error(path, absl::StrCat(has_pattern ? "pattern: " : "format: ",
                                        body.status().message()));
      }
      const uint32_t rule = g_.NewRule("pattern_string");
      g_.AddAlternative(rule, Quoted(*body));
      return rule;
    }
    if (!min_len && !max_len) return any_string_;
    const int lo = min_len ? static_cast<int>(std::max(0.0, std::ceil(*min_len))) : 0;
    int hi = -1;
    if (max_len) hi = static_cast<int>(std::floor(*max_len));
    constexpr int kMaxBound = 10000;
    if (lo > kMaxBound || hi > kMaxBound) {
      return Error(path, absl::StrCat("minLength/maxLength over ", kMaxBound));
    }
    if (hi >= 0 && hi < lo) return Nothing(path, "maxLength < minLength");
    const uint32_t body = g_.AddRepeat("chars", any_char_, lo, hi);
    const uint32_t rule = g_.NewRule("string_len");
    g_.AddAlternative(rule, Quoted(body));
    return rule;
  }

  // RFC 3986 (section 3 and appendix A), without IP-literal hosts ("[v6]"): every string these
  // match is a URI (a URI reference); a few valid ones (IPv6 hosts) are not produced.
  static constexpr char kUriScheme[] = "[A-Za-z][A-Za-z0-9+.\\-]*";
  static constexpr char kPchar[] = "([A-Za-z0-9\\-._~!$&'()*+,;=:@]|%[0-9A-Fa-f]{2})";
  static constexpr char kPcharNoColon[] = "([A-Za-z0-9\\-._~!$&'()*+,;=@]|%[0-9A-Fa-f]{2})";
  static constexpr char kAuthority[] =
      "(([A-Za-z0-9\\-._~!$&'()*+,;=:]|%[0-9A-Fa-f]{2})*@)?"  // userinfo
      "([A-Za-z0-9\\-._~!$&'()*+,;=]|%[0-9A-Fa-f]{2})*"        // reg-name (IPv4 included)
      "(:[0-9]*)?";                                               // port
  // path-abempty, *( "/" segment ), written flat: a '/' and then pchars and '/'s, which is the
  // same language with one repetition instead of two nested ones, so the mask's cut sits near
  // the string rather than below every segment (docs/structured-outputs.md, "Token masks").
  static constexpr char kPcharOrSlash[] = "([A-Za-z0-9\\-._~!$&'()*+,;=:@/]|%[0-9A-Fa-f]{2})";
  inline static const std::string kSegments = absl::StrCat("(/", kPcharOrSlash, "*)?");
  // hier-part: "//" authority path-abempty | path-absolute | path-rootless | path-empty.
  inline static const std::string kHierPart =
      absl::StrCat("(//", kAuthority, kSegments, "|/(", kPchar, "+", kSegments, ")?|", kPchar,
                   "+", kSegments, ")?");
  // relative-part: the same with path-noscheme (no ':' in the first segment).
  inline static const std::string kRelativePart =
      absl::StrCat("(//", kAuthority, kSegments, "|/(", kPchar, "+", kSegments, ")?|",
                   kPcharNoColon, "+", kSegments, ")?");
  inline static const std::string kQueryFragment =
      "(\\?([A-Za-z0-9\\-._~!$&'()*+,;=:@/?]|%[0-9A-Fa-f]{2})*)?"
      "(#([A-Za-z0-9\\-._~!$&'()*+,;=:@/?]|%[0-9A-Fa-f]{2})*)?";

  absl::StatusOr<std::string> FormatRegex(const std::string& format, absl::string_view path) {
    static const std::map<std::string, std::string> kFormats = {
        {"date", R"(^\d{4}-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01])$)"},
        {"time", R"(^([01]\d|2[0-3]):[0-5]\d:([0-5]\d|60)(\.\d+)?(Z|z|[+-]([01]\d|2[0-3]):[0-5]\d)$)"},
        {"date-time",
         R"(^\d{4}-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01])[Tt]([01]\d|2[0-3]):[0-5]\d:([0-5]\d|60)(\.\d+)?(Z|z|[+-]([01]\d|2[0-3]):[0-5]\d)$)"},
        {"uuid", R"(^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$)"},
        {"email",
         R"(^[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+(\.[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+)*@[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)+$)"},
        {"ipv4", R"(^((25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)\.){3}(25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)$)"},
        {"uri", absl::StrCat("^", kUriScheme, ":", kHierPart, kQueryFragment, "$")},
        {"uri-reference",
         absl::StrCat("^(", kUriScheme, ":", kHierPart, "|", kRelativePart, ")", kQueryFragment,
                      "$")},
        {"byte", R"(^([A-Za-z0-9+/]{4})*([A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$)"},
        {"hostname",
         R"(^[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$)"},
    };
    auto it = kFormats.find(format);
    if (it == kFormats.end()) {
      return Error(path, absl::StrCat("format '", format, "' is not supported"));
    }
    return it->second;
  }

  absl::StatusOr<uint32_t> CompileArray(const Json& s, const std::string& path, int depth) {
    std::vector<uint32_t> prefix;
    const Json* prefix_json = nullptr;
    const Json* items = nullptr;  // schema for the rest; nullptr: any
    if (s.contains("prefixItems")) {
      prefix_json = &s["prefixItems"];
      if (s.contains("items")) items = &s["items"];
    } else if (s.contains("items") && s["items"].is_array()) {
      prefix_json = &s["items"];  // draft-04 tuple form
      if (s.contains("additionalItems")) items = &s["additionalItems"];
    } else if (s.contains("items")) {
      items = &s["items"];
    }
    if (prefix_json != nullptr) {
      if (!prefix_json->is_array()) return Error(path, "prefixItems must be an array");
      for (size_t i = 0; i < prefix_json->size(); ++i) {
        PD_ASSIGN_OR_RETURN(const uint32_t r,
                            Compile((*prefix_json)[i], absl::StrCat(path, "/prefixItems/", i),
                                    depth + 1));
        prefix.push_back(r);
      }
    }
    bool rest_allowed = true;
    uint32_t rest = any_value_;
    if (items != nullptr) {
      if (items->is_boolean() && !items->get<bool>()) {
        rest_allowed = false;
      } else {
        absl::StatusOr<uint32_t> r = Compile(*items, absl::StrCat(path, "/items"), depth + 1);
        if (!r.ok()) {
          if (!IsNothing(r.status())) return r.status();
          rest_allowed = false;
        } else {
          rest = *r;
        }
      }
    }
    std::optional<double> min_items = Number(s, "minItems");
    std::optional<double> max_items = Number(s, "maxItems");
    const int64_t lo = min_items ? static_cast<int64_t>(std::max(0.0, *min_items)) : 0;
    int64_t hi = max_items ? static_cast<int64_t>(*max_items) : -1;
    const int64_t p = static_cast<int64_t>(prefix.size());
    if (!rest_allowed) hi = hi < 0 ? p : std::min(hi, p);
    if (hi >= 0 && hi < lo) return Nothing(path, "maxItems < minItems");
    constexpr int64_t kMaxBound = 1000;
    if (lo > kMaxBound || hi > kMaxBound) {
      return Error(path, absl::StrCat("minItems/maxItems over ", kMaxBound));
    }
    // Elements after the prefix: index i >= p, count in [max(0, lo - p), hi - p].
    const int rest_min = static_cast<int>(std::max<int64_t>(0, lo - p));
    const int rest_max = hi < 0 ? -1 : static_cast<int>(std::max<int64_t>(0, hi - p));
    uint32_t tail = g_.NewRule("items_tail");
    if (rest_max != 0) {
      const uint32_t comma_item = g_.NewRule("comma_item");
      g_.AddAlternative(comma_item, {Grammar::Ref(comma_), Grammar::Ref(rest)});
      if (p > 0) {
        g_.AddAlternative(tail, {Grammar::Ref(g_.AddRepeat("items", comma_item, rest_min,
                                                           rest_max))});
      } else {
        const uint32_t more =
            g_.AddRepeat("items", comma_item, std::max(0, rest_min - 1),
                         rest_max < 0 ? -1 : rest_max - 1);
        g_.AddAlternative(tail, {Grammar::Ref(rest), Grammar::Ref(more)});
        if (rest_min == 0) g_.AddAlternative(tail, {});
      }
    } else {
      g_.AddAlternative(tail, {});
    }
    // Prefix elements from the last one back: arr_i ::= sep_i p_i arr_{i+1} | ε (i >= lo).
    uint32_t next = tail;
    const int64_t upto = hi < 0 ? p : std::min(p, hi);
    for (int64_t i = upto - 1; i >= 0; --i) {
      const uint32_t rule = g_.NewRule("items_prefix");
      Seq seq;
      if (i > 0) seq.push_back(Grammar::Ref(comma_));
      seq.push_back(Grammar::Ref(prefix[static_cast<size_t>(i)]));
      seq.push_back(Grammar::Ref(next));
      g_.AddAlternative(rule, std::move(seq));
      if (i >= lo) g_.AddAlternative(rule, {});
      next = rule;
    }
    const uint32_t rule = g_.NewRule("array");
    g_.AddAlternative(rule, {g_.Byte('['), Grammar::Ref(ws_), Grammar::Ref(next),
                             Grammar::Ref(ws_), g_.Byte(']')});
    return rule;
  }

  // A JSON string that is none of `excluded` (their canonical escaped forms), as a trie.
  struct TrieNode {
    bool terminal = false;
    std::map<uint32_t, size_t> children;  // code point -> node
  };

  // The first of `names` that has a match of `pattern` (search semantics, as JSON Schema's
  // patterns); "" when none does.
  static absl::StatusOr<std::string> FirstMatch(const std::string& pattern,
                                                const std::set<std::string>& names) {
    if (names.empty()) return std::string();
    Grammar g;
    RegexOptions options;
    options.search = true;
    PD_ASSIGN_OR_RETURN(const uint32_t root, CompileRegex(pattern, options, &g));
    g.set_root(root);
    PD_ASSIGN_OR_RETURN(std::shared_ptr<const CompiledGrammar> compiled,
                        CompiledGrammar::Compile(g));
    for (const std::string& name : names) {
      if (Matches(compiled, name)) return name;
    }
    return std::string();
  }

  uint32_t KeyNotIn(const std::vector<std::string>& excluded) {
    std::vector<TrieNode> trie(1);
    for (const std::string& key : excluded) {
      size_t node = 0;
      size_t i = 0;
      while (i < key.size()) {
        // Keys come from a parsed JSON document: valid UTF-8.
        const utf8::Char ch = utf8::Decode(key, i);
        const uint32_t cp = ch.valid() ? static_cast<uint32_t>(ch.code_point) : 0xFFFD;
        i += ch.length;
        auto it = trie[node].children.find(cp);
        if (it == trie[node].children.end()) {
          trie.emplace_back();
          trie[node].children.emplace(cp, trie.size() - 1);
          node = trie.size() - 1;
        } else {
          node = it->second;
        }
      }
      trie[node].terminal = true;
    }
    const uint32_t rest = g_.NewRule("key_rest");
    g_.AddAlternative(rest, {Grammar::Ref(g_.AddRepeat("chars", any_char_, 0, -1)),
                             g_.Byte('"')});
    std::vector<uint32_t> rules(trie.size());
    for (size_t n = 0; n < trie.size(); ++n) rules[n] = g_.NewRule("key_trie");
    for (size_t n = 0; n < trie.size(); ++n) {
      if (!trie[n].terminal) g_.AddAlternative(rules[n], {g_.Byte('"')});
      std::vector<CodePointRange> taken;
      for (const auto& [cp, child] : trie[n].children) {
        taken.push_back({cp, cp});
        g_.AddAlternative(rules[n], {Grammar::Ref(JsonChar({{cp, cp}})), Grammar::Ref(rules[child])});
      }
      const std::vector<CodePointRange> other = ComplementRanges(taken);
      if (!other.empty()) {
        g_.AddAlternative(rules[n], {Grammar::Ref(JsonChar(other)), Grammar::Ref(rest)});
      }
    }
    const uint32_t rule = g_.NewRule("other_key");
    g_.AddAlternative(rule, {g_.Byte('"'), Grammar::Ref(rules[0])});
    return rule;
  }

  absl::StatusOr<uint32_t> CompileObject(const Json& s, const std::string& path, int depth) {
    struct Prop {
      std::string name;
      uint32_t value;
      bool required;
    };
    std::set<std::string> required;
    if (s.contains("required")) {
      if (!s["required"].is_array()) return Error(path, "required must be an array");
      for (const Json& r : s["required"]) {
        if (!r.is_string()) return Error(path, "required must list strings");
        required.insert(r.get<std::string>());
      }
    }
    std::vector<Prop> props;
    std::set<std::string> known;
    if (s.contains("properties")) {
      const Json& ps = s["properties"];
      if (!ps.is_object()) return Error(path, "properties must be an object");
      for (auto it = ps.begin(); it != ps.end(); ++it) {
        known.insert(it.key());
        const bool req = required.count(it.key()) > 0;
        absl::StatusOr<uint32_t> v =
            Compile(it.value(), absl::StrCat(path, "/properties/", it.key()), depth + 1);
        if (!v.ok()) {
          if (!IsNothing(v.status())) return v.status();
          if (req) return Error(path, absl::StrCat("required property '", it.key(),
                                                   "' matches nothing"));
          continue;  // the property may not appear
        }
        props.push_back({it.key(), *v, req});
      }
    }
    // Required names without a schema: their value is additionalProperties' (below).
    std::vector<std::string> required_only;
    for (const std::string& r : required) {
      if (known.count(r) == 0) {
        known.insert(r);
        required_only.push_back(r);
      }
    }
    bool additional = true;
    uint32_t additional_value = any_value_;
    if (s.contains("additionalProperties")) {
      const Json& a = s["additionalProperties"];
      if (a.is_boolean()) {
        additional = a.get<bool>();
      } else {
        absl::StatusOr<uint32_t> v =
            Compile(a, absl::StrCat(path, "/additionalProperties"), depth + 1);
        if (!v.ok()) {
          if (!IsNothing(v.status())) return v.status();
          additional = false;
        } else {
          additional_value = *v;
        }
      }
    }
    for (const std::string& r : required_only) {
      if (!additional) {
        return Nothing(path, absl::StrCat("required property '", r,
                                          "' is not allowed (additionalProperties)"));
      }
      props.push_back({r, additional_value, true});
    }
    // patternProperties (one pattern): the members after the known ones have keys matching it
    // and values of its schema. Keys outside the pattern would need the pattern's complement:
    // they are not produced (an additionalProperties schema then has nothing to apply to).
    // The one case that changes nothing is kept exact: any value under the pattern while any
    // member may appear.
    std::optional<uint32_t> pattern_key;
    if (s.contains("patternProperties")) {
      const Json& pp = s["patternProperties"];
      if (!pp.is_object()) return Error(path, "patternProperties must be an object");
      if (pp.size() > 1) {
        return Error(path, "patternProperties with more than one pattern is not supported");
      }
      if (pp.size() == 1) {
        const std::string pattern = pp.begin().key();
        const Json& value_schema = pp.begin().value();
        const std::string ppath = absl::StrCat(path, "/patternProperties");
        const bool any = value_schema == Json(true) || value_schema == Json::object();
        absl::StatusOr<std::string> matched = FirstMatch(pattern, known);
        if (!matched.ok()) return Error(ppath, matched.status().message());
        if (!matched->empty()) {
          return Error(ppath, absl::StrCat("patternProperties whose pattern matches the "
                                           "property '", *matched, "' is not supported"));
        }
        if (!(any && additional && additional_value == any_value_)) {
          RegexOptions ropts;
          ropts.search = true;
          ropts.char_class = [this](Grammar*, const std::vector<CodePointRange>& r) {
            return JsonChar(r);
          };
          absl::StatusOr<uint32_t> body = CompileRegex(pattern, ropts, &g_);
          if (!body.ok()) return Error(ppath, body.status().message());
          absl::StatusOr<uint32_t> v = Compile(value_schema, ppath, depth + 1);
          if (!v.ok() && !IsNothing(v.status())) return v.status();
          additional = v.ok();  // a pattern whose values match nothing: no extra member
          if (v.ok()) {
            additional_value = *v;
            pattern_key = g_.NewRule("pattern_key");
            g_.AddAlternative(*pattern_key, Quoted(*body));
          }
        }
      }
    }
    size_t num_required = 0;
    for (const Prop& p : props) num_required += p.required ? 1 : 0;
    if (auto mn = Number(s, "minProperties"); mn && *mn > static_cast<double>(num_required)) {
      return Error(path, "minProperties above the number of required properties is not supported");
    }
    if (auto mx = Number(s, "maxProperties");
        mx && (additional || *mx < static_cast<double>(props.size()))) {
      return Error(path, "maxProperties below the number of possible properties is not supported");
    }
    // Additional members after the known ones: ("," key ":" value)*, keys not known.
    uint32_t extra_tail = 0;   // after at least one member
    uint32_t extra_first = 0;  // when no member came before
    if (additional) {
      const uint32_t key =
          pattern_key ? *pattern_key
                      : KeyNotIn(std::vector<std::string>(known.begin(), known.end()));
      const uint32_t member = g_.NewRule("extra_member");
      g_.AddAlternative(member, {Grammar::Ref(key), Grammar::Ref(colon_),
                                 Grammar::Ref(additional_value)});
      const uint32_t comma_member = g_.NewRule("comma_extra");
      g_.AddAlternative(comma_member, {Grammar::Ref(comma_), Grammar::Ref(member)});
      extra_tail = g_.AddRepeat("extras", comma_member, 0, -1);
      extra_first = g_.NewRule("extras_first");
      g_.AddAlternative(extra_first, {Grammar::Ref(member), Grammar::Ref(extra_tail)});
      g_.AddAlternative(extra_first, {});
    }
    // rest[i][c]: members from property i on; c = a member came before (needs a comma).
    const size_t n = props.size();
    std::vector<std::array<uint32_t, 2>> rest(n + 1);
    for (int c = 0; c < 2; ++c) {
      rest[n][c] = g_.NewRule("members_end");
      if (additional) {
        g_.AddAlternative(rest[n][c], {Grammar::Ref(c ? extra_tail : extra_first)});
      } else {
        g_.AddAlternative(rest[n][c], {});
      }
    }
    for (size_t i = n; i-- > 0;) {
      const uint32_t member = g_.NewRule(absl::StrCat("member:", props[i].name));
      Seq m = g_.Literal(Json(props[i].name).dump());
      m.push_back(Grammar::Ref(colon_));
      m.push_back(Grammar::Ref(props[i].value));
      g_.AddAlternative(member, std::move(m));
      for (int c = 0; c < 2; ++c) {
        rest[i][c] = g_.NewRule("members");
        Seq with;
        if (c) with.push_back(Grammar::Ref(comma_));
        with.push_back(Grammar::Ref(member));
        with.push_back(Grammar::Ref(rest[i + 1][1]));
        g_.AddAlternative(rest[i][c], std::move(with));
        if (!props[i].required) g_.AddAlternative(rest[i][c], {Grammar::Ref(rest[i + 1][c])});
      }
    }
    const uint32_t rule = g_.NewRule("object");
    g_.AddAlternative(rule, {g_.Byte('{'), Grammar::Ref(ws_), Grammar::Ref(rest[0][0]),
                             Grammar::Ref(ws_), g_.Byte('}')});
    return rule;
  }

  const Json& root_;
  const JsonSchemaOptions& options_;
  Grammar g_;
  uint32_t ws_ = 0, comma_ = 0, colon_ = 0, any_char_ = 0, any_string_ = 0, digit_ = 0,
           digit19_ = 0, any_integer_ = 0, any_number_ = 0, boolean_ = 0, null_ = 0,
           any_value_ = 0, any_object_ = 0, any_frac_ = 0, more_digits_ = 0;
  std::map<std::string, uint32_t> type_rule_;
  std::map<std::vector<std::pair<uint32_t, uint32_t>>, uint32_t> char_cache_;
  std::map<std::string, uint32_t> literal_cache_;
  std::map<std::string, uint32_t> ref_rules_;
  std::set<std::string> merging_refs_;
};

}  // namespace

absl::StatusOr<Grammar> CompileJsonSchema(absl::string_view schema_json,
                                          const JsonSchemaOptions& options) {
  // Nesting is bounded before parsing: the document (enum values included) is later walked
  // and serialized recursively.
  int depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < schema_json.size(); ++i) {
    const char c = schema_json[i];
    if (in_string) {
      if (c == '\\') {
        ++i;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > 2 * options.max_depth) {
        return absl::InvalidArgumentError(absl::StrCat(
            "json schema: nested deeper than ", 2 * options.max_depth, " levels"));
      }
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  Json schema = Json::parse(schema_json.begin(), schema_json.end(), nullptr,
                            /*allow_exceptions=*/false);
  if (schema.is_discarded()) return absl::InvalidArgumentError("json schema: not valid JSON");
  SchemaCompiler compiler(schema, options);
  return compiler.Run();
}

absl::StatusOr<Grammar> AnyJsonGrammar(bool object_only, const JsonSchemaOptions& options) {
  const Json empty = Json::object();
  SchemaCompiler compiler(empty, options);
  return compiler.RunAny(object_only);
}

}  // namespace pd::grammar
