#include "engine/grammar/structural_tag.h"

#include <array>
#include <deque>
#include <map>
#include <optional>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "nlohmann/json.hpp"

namespace pd::grammar {
namespace {

using Json = nlohmann::ordered_json;

absl::Status Bad(absl::string_view field, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(field, " ", what));
}

absl::StatusOr<std::string> TagString(const Json& parent, const std::string& field,
                                      const std::string& key, bool nonempty) {
  const auto it = parent.find(key);
  if (it == parent.end() || !it->is_string()) return Bad(field, "must be a string");
  std::string s = it->get<std::string>();
  if (nonempty && s.empty()) return Bad(field, "must not be empty");
  const size_t limit = field.rfind("triggers", 0) == 0 ? kMaxTriggerBytes : kMaxTagStringBytes;
  if (s.size() > limit) {
    return Bad(field, absl::StrCat("is ", s.size(), " bytes, at most ", limit));
  }
  return s;
}

// `s` with every occurrence of a special token's text (the longest one at each position)
// replaced by the token's grammar bytes (SpecialTokenBytes).
std::string EncodeSpecials(const std::string& s, const std::vector<std::string>& specials) {
  if (specials.empty()) return s;
  std::string out;
  size_t i = 0;
  while (i < s.size()) {
    const std::string* longest = nullptr;
    for (const std::string& t : specials) {
      if (s.compare(i, t.size(), t) == 0 && (longest == nullptr || t.size() > longest->size())) {
        longest = &t;
      }
    }
    if (longest == nullptr) {
      out.push_back(s[i++]);
      continue;
    }
    out += SpecialTokenBytes(*longest);
    i += longest->size();
  }
  return out;
}

// The tag as the grammar reads it: its special tokens' texts replaced by their bytes.
StructuralTag Encoded(const StructuralTag& tag) {
  StructuralTag e = tag;
  for (std::string& t : e.triggers) t = EncodeSpecials(t, tag.special_tokens);
  for (StructuralTag::Structure& st : e.structures) {
    st.begin = EncodeSpecials(st.begin, tag.special_tokens);
    st.end = EncodeSpecials(st.end, tag.special_tokens);
  }
  return e;
}

bool IsSpecialStart(const std::string& encoded_trigger) {
  return !encoded_trigger.empty() && static_cast<uint8_t>(encoded_trigger[0]) == kSpecialTokenMark;
}

// Every byte but the special token mark: what free text may hold.
ByteSet TextBytes() {
  ByteSet all;
  all.set();
  all.reset(kSpecialTokenMark);
  return all;
}

// The triggers' automaton (Aho-Corasick): state 0 is "no part of a trigger written"; a state
// is the longest end of the text that is a prefix of a trigger. `ends` lists the triggers that
// end at a state (its own and, through the failure links, the shorter ones that end there).
struct TriggerAutomaton {
  std::vector<std::array<uint32_t, 256>> next;
  std::vector<std::vector<size_t>> ends;

  explicit TriggerAutomaton(const std::vector<std::string>& triggers) {
    next.emplace_back();
    next[0].fill(0);
    ends.emplace_back();
    std::vector<std::array<bool, 256>> has_child(1);
    has_child[0].fill(false);
    for (size_t t = 0; t < triggers.size(); ++t) {
      uint32_t s = 0;
      for (const char c : triggers[t]) {
        const auto b = static_cast<uint8_t>(c);
        if (!has_child[s][b]) {
          next.emplace_back();
          next.back().fill(0);
          ends.emplace_back();
          has_child.emplace_back();
          has_child.back().fill(false);
          has_child[s][b] = true;
          next[s][b] = static_cast<uint32_t>(next.size() - 1);
        }
        s = next[s][b];
      }
      ends[s].push_back(t);
    }
    // Breadth first: a state's failure link is shallower, so complete before it.
    std::vector<uint32_t> fail(next.size(), 0);
    std::deque<uint32_t> queue;
    for (int b = 0; b < 256; ++b) {
      if (has_child[0][b]) queue.push_back(next[0][b]);
    }
    while (!queue.empty()) {
      const uint32_t s = queue.front();
      queue.pop_front();
      for (const size_t t : ends[fail[s]]) ends[s].push_back(t);
      for (int b = 0; b < 256; ++b) {
        if (has_child[s][b]) {
          const uint32_t child = next[s][b];
          fail[child] = s == 0 ? 0 : next[fail[s]][b];
          queue.push_back(child);
        } else {
          next[s][b] = next[fail[s]][b];
        }
      }
    }
  }
};

// The structures' schemas imported into `g`, each compiled once; per structure, its root.
absl::StatusOr<std::vector<uint32_t>> ImportSchemas(const StructuralTag& tag,
                                                    const JsonSchemaOptions& options, Grammar* g) {
  absl::flat_hash_map<std::string, uint32_t> schema_roots;
  std::vector<uint32_t> roots;
  for (size_t i = 0; i < tag.structures.size(); ++i) {
    const std::string& text = tag.structures[i].schema;
    auto it = schema_roots.find(text);
    if (it == schema_roots.end()) {
      absl::StatusOr<Grammar> schema = CompileJsonSchema(text, options);
      if (!schema.ok()) {
        return absl::Status(schema.status().code(),
                            absl::StrCat("structures[", i,
                                         "].schema: ", schema.status().message()));
      }
      it = schema_roots.emplace(text, g->Import(*schema)).first;
    }
    roots.push_back(it->second);
  }
  return roots;
}

// Adds to `rule` (where the triggers `ends` were just written) the rest of every structure
// that begins with one of them: the rest of its begin, its schema (`roots`), its end, then
// `after` (none when nullopt).
void AddStructures(const StructuralTag& tag, const std::vector<uint32_t>& roots,
                   const std::vector<size_t>& ends, std::optional<uint32_t> after, uint32_t rule,
                   Grammar* g) {
  std::vector<std::pair<size_t, std::string>> seen;  // structure, rest of its begin
  for (const size_t t : ends) {
    const std::string& trigger = tag.triggers[t];
    for (size_t i = 0; i < tag.structures.size(); ++i) {
      const StructuralTag::Structure& st = tag.structures[i];
      if (!absl::StartsWith(st.begin, trigger)) continue;
      std::pair<size_t, std::string> key(i, st.begin.substr(trigger.size()));
      if (std::find(seen.begin(), seen.end(), key) != seen.end()) continue;
      Grammar::Sequence seq = g->Literal(key.second);
      seq.push_back(Grammar::Ref(roots[i]));
      for (const Element& e : g->Literal(st.end)) seq.push_back(e);
      if (after.has_value()) seq.push_back(Grammar::Ref(*after));
      g->AddAlternative(rule, std::move(seq));
      seen.push_back(std::move(key));
    }
  }
}

// `at_start`: the triggers' prefixes as a trie from the start of the output (whitespace first
// is skipped), leaving it for free text at the first byte no trigger continues with.
absl::StatusOr<Grammar> CompileAtStart(const StructuralTag& tag,
                                       const JsonSchemaOptions& options) {
  Grammar g;
  std::vector<std::array<int32_t, 256>> child(1);
  child[0].fill(-1);
  std::vector<std::vector<size_t>> ends(1);
  // Inside a special token's bytes (an odd number of marks on the path): only a trigger may
  // continue, and the output may not end.
  std::vector<bool> inside(1, false);
  for (size_t t = 0; t < tag.triggers.size(); ++t) {
    size_t s = 0;
    for (const char c : tag.triggers[t]) {
      const auto b = static_cast<uint8_t>(c);
      if (child[s][b] < 0) {
        child[s][b] = static_cast<int32_t>(child.size());
        child.emplace_back().fill(-1);
        ends.emplace_back();
        inside.push_back(inside[s] != (b == kSpecialTokenMark));
      }
      s = static_cast<size_t>(child[s][b]);
    }
    ends[s].push_back(t);
  }
  std::vector<uint32_t> rule(child.size());
  for (size_t s = 0; s < child.size(); ++s) rule[s] = g.NewRule(absl::StrCat("start_", s));
  g.set_root(rule[0]);
  PD_ASSIGN_OR_RETURN(const std::vector<uint32_t> roots, ImportSchemas(tag, options, &g));
  const ByteSet all = TextBytes();
  const uint32_t text = g.NewRule("text");
  g.AddAlternative(text, {});
  g.AddAlternative(text, {g.Bytes(all), Grammar::Ref(text)});
  ByteSet space;
  for (const char c : {' ', '\t', '\n', '\r'}) space.set(static_cast<uint8_t>(c));
  for (size_t s = 0; s < child.size(); ++s) {
    if (!ends[s].empty()) {
      // A trigger was just written: the rest of a structure that begins with it, then the end.
      AddStructures(tag, roots, ends[s], std::nullopt, rule[s], &g);
      continue;
    }
    if (!inside[s]) {
      g.AddAlternative(rule[s], {});  // the output may end before a trigger is complete
    }
    ByteSet other = all;
    for (int b = 0; b < 256; ++b) {
      if (child[s][b] < 0) continue;
      other.reset(static_cast<size_t>(b));
      g.AddAlternative(rule[s],
                       {g.Byte(static_cast<uint8_t>(b)),
                        Grammar::Ref(rule[static_cast<size_t>(child[s][b])])});
    }
    if (inside[s]) continue;
    if (s == 0) {
      // Whitespace before a trigger is skipped (unless a trigger starts with it).
      const ByteSet skip = space & other;
      if (skip.any()) g.AddAlternative(rule[0], {g.Bytes(skip), Grammar::Ref(rule[0])});
      other &= ~space;
    }
    if (other.any()) g.AddAlternative(rule[s], {g.Bytes(other), Grammar::Ref(text)});
  }
  PD_RETURN_IF_ERROR(g.Validate());
  return g;
}

// Triggers anywhere in free text. The plain triggers run the Aho-Corasick automaton, one
// rule per state; a trigger that starts with a special token cannot begin inside other text,
// so every free text state may write it whole.
absl::StatusOr<Grammar> CompileAnywhere(const StructuralTag& tag,
                                        const JsonSchemaOptions& options) {
  Grammar g;
  std::vector<std::string> plain;
  std::vector<size_t> plain_trigger;  // plain[i] is tag.triggers[plain_trigger[i]]
  std::vector<size_t> special;        // triggers that start with a special token
  for (size_t t = 0; t < tag.triggers.size(); ++t) {
    if (IsSpecialStart(tag.triggers[t])) {
      special.push_back(t);
    } else {
      plain.push_back(tag.triggers[t]);
      plain_trigger.push_back(t);
    }
  }
  const TriggerAutomaton automaton(plain);
  const size_t n = automaton.next.size();
  // One rule per state: "free text from here" where no trigger ends, "a structure" where one
  // does.
  std::vector<uint32_t> rule(n);
  for (size_t s = 0; s < n; ++s) {
    rule[s] = automaton.ends[s].empty() ? g.NewRule(absl::StrCat("text_", s))
                                        : g.NewRule(absl::StrCat("tagged_", s));
  }
  g.set_root(rule[0]);
  PD_ASSIGN_OR_RETURN(const std::vector<uint32_t> roots, ImportSchemas(tag, options, &g));
  std::vector<uint32_t> special_rule;  // after special[i]: the rest of its structures
  for (const size_t t : special) {
    special_rule.push_back(g.NewRule(absl::StrCat("tagged_special_", t)));
    AddStructures(tag, roots, {t}, rule[0], special_rule.back(), &g);
  }
  const ByteSet text = TextBytes();
  for (size_t s = 0; s < n; ++s) {
    if (automaton.ends[s].empty()) {
      g.AddAlternative(rule[s], {});          // free text may end here
      std::map<uint32_t, ByteSet> by_target;  // ordered: the same grammar every compile
      for (int b = 0; b < 256; ++b) {
        if (text.test(static_cast<size_t>(b))) {
          by_target[automaton.next[s][b]].set(static_cast<size_t>(b));
        }
      }
      for (const auto& [target, bytes] : by_target) {
        g.AddAlternative(rule[s], {g.Bytes(bytes), Grammar::Ref(rule[target])});
      }
      for (size_t i = 0; i < special.size(); ++i) {
        Grammar::Sequence seq = g.Literal(tag.triggers[special[i]]);
        seq.push_back(Grammar::Ref(special_rule[i]));
        g.AddAlternative(rule[s], std::move(seq));
      }
      continue;
    }
    // A trigger was just written: the rest of a structure that begins with it, then free text.
    std::vector<size_t> ends;
    for (const size_t i : automaton.ends[s]) ends.push_back(plain_trigger[i]);
    AddStructures(tag, roots, ends, rule[0], rule[s], &g);
  }
  PD_RETURN_IF_ERROR(g.Validate());
  return g;
}

}  // namespace

absl::StatusOr<StructuralTag> ParseStructuralTag(absl::string_view text) {
  const Json doc = Json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded() || !doc.is_object()) {
    return absl::InvalidArgumentError("a structural tag must be a JSON object");
  }
  for (const auto& [key, value] : doc.items()) {
    if (key == "type") {
      if (!value.is_string() || value.get<std::string>() != "structural_tag") {
        return Bad("type", "must be \"structural_tag\"");
      }
    } else if (key == "at_start") {
      if (!value.is_boolean()) return Bad("at_start", "must be a boolean");
    } else if (key != "structures" && key != "triggers" && key != "special_tokens") {
      return Bad(key,
                 "is not a field of a structural tag (structures, triggers, at_start, "
                 "special_tokens)");
    }
  }
  StructuralTag tag;
  tag.at_start = doc.value("at_start", false);
  if (const auto specials = doc.find("special_tokens"); specials != doc.end()) {
    if (!specials->is_array()) return Bad("special_tokens", "must be an array of strings");
    if (specials->size() > kMaxTagTriggers) {
      return Bad("special_tokens",
                 absl::StrCat("has ", specials->size(), " entries, at most ", kMaxTagTriggers));
    }
    for (size_t i = 0; i < specials->size(); ++i) {
      const std::string field = absl::StrCat("special_tokens[", i, "]");
      const Json& v = (*specials)[i];
      if (!v.is_string() || v.get_ref<const std::string&>().empty()) {
        return Bad(field, "must be a non-empty string");
      }
      std::string t = v.get<std::string>();
      if (t.size() > kMaxTriggerBytes) {
        return Bad(field, absl::StrCat("is ", t.size(), " bytes, at most ", kMaxTriggerBytes));
      }
      if (std::find(tag.special_tokens.begin(), tag.special_tokens.end(), t) !=
          tag.special_tokens.end()) {
        return Bad(field, absl::StrCat("\"", t, "\" is listed twice"));
      }
      tag.special_tokens.push_back(std::move(t));
    }
  }
  std::vector<std::string> triggers_read;  // as the grammar reads them
  const auto triggers = doc.find("triggers");
  if (triggers == doc.end() || !triggers->is_array() || triggers->empty()) {
    return Bad("triggers", "must be a non-empty array of strings");
  }
  if (triggers->size() > kMaxTagTriggers) {
    return Bad("triggers", absl::StrCat("has ", triggers->size(), " entries, at most ",
                                        kMaxTagTriggers));
  }
  for (size_t i = 0; i < triggers->size(); ++i) {
    const std::string field = absl::StrCat("triggers[", i, "]");
    if (!(*triggers)[i].is_string()) return Bad(field, "must be a string");
    std::string t = (*triggers)[i].get<std::string>();
    if (t.empty()) return Bad(field, "must not be empty");
    if (t.size() > kMaxTriggerBytes) {
      return Bad(field, absl::StrCat("is ", t.size(), " bytes, at most ", kMaxTriggerBytes));
    }
    // (As the grammar reads it: a special token's text is not the token.)
    std::string read = EncodeSpecials(t, tag.special_tokens);
    if (read.find(static_cast<char>(kSpecialTokenMark), 1) != std::string::npos &&
        !IsSpecialStart(read)) {
      return Bad(field, "holds a special token after its start (one may only start a trigger)");
    }
    triggers_read.push_back(std::move(read));
    tag.triggers.push_back(std::move(t));
  }
  const auto structures = doc.find("structures");
  if (structures == doc.end() || !structures->is_array() || structures->empty()) {
    return Bad("structures", "must be a non-empty array of {begin, schema, end} objects");
  }
  if (structures->size() > kMaxTagStructures) {
    return Bad("structures", absl::StrCat("has ", structures->size(), " entries, at most ",
                                          kMaxTagStructures));
  }
  std::vector<bool> used(tag.triggers.size(), false);
  for (size_t i = 0; i < structures->size(); ++i) {
    const Json& s = (*structures)[i];
    const std::string field = absl::StrCat("structures[", i, "]");
    if (!s.is_object()) return Bad(field, "must be an object with begin, schema and end");
    for (const auto& [key, value] : s.items()) {
      if (key != "begin" && key != "schema" && key != "end") {
        return Bad(absl::StrCat(field, ".", key), "is not a field of a structure");
      }
    }
    StructuralTag::Structure st;
    PD_ASSIGN_OR_RETURN(st.begin, TagString(s, field + ".begin", "begin", false));
    PD_ASSIGN_OR_RETURN(st.end, TagString(s, field + ".end", "end", false));
    const auto schema = s.find("schema");
    if (schema == s.end() || !(schema->is_object() || schema->is_boolean())) {
      return Bad(field + ".schema", "must be a JSON Schema (an object)");
    }
    st.schema = schema->dump();
    bool starts = false;
    const std::string begin = EncodeSpecials(st.begin, tag.special_tokens);
    for (size_t t = 0; t < triggers_read.size(); ++t) {
      if (absl::StartsWith(begin, triggers_read[t])) used[t] = starts = true;
    }
    if (!starts) {
      return Bad(field + ".begin",
                 absl::StrCat("\"", st.begin.substr(0, 64), "\" does not start with a trigger"));
    }
    tag.structures.push_back(std::move(st));
  }
  for (size_t t = 0; t < used.size(); ++t) {
    if (!used[t]) {
      return Bad(absl::StrCat("triggers[", t, "]"),
                 absl::StrCat("\"", tag.triggers[t], "\" begins no structure"));
    }
  }
  return tag;
}

std::string StructuralTagJson(const StructuralTag& tag) {
  Json doc = {{"type", "structural_tag"}, {"structures", Json::array()}, {"triggers", tag.triggers}};
  if (tag.at_start) doc["at_start"] = true;
  if (!tag.special_tokens.empty()) doc["special_tokens"] = tag.special_tokens;
  for (const StructuralTag::Structure& s : tag.structures) {
    Json schema = Json::parse(s.schema, nullptr, /*allow_exceptions=*/false);
    doc["structures"].push_back({{"begin", s.begin}, {"schema", std::move(schema)}, {"end", s.end}});
  }
  return doc.dump();
}

absl::StatusOr<Grammar> CompileStructuralTag(const StructuralTag& tag,
                                             const JsonSchemaOptions& options) {
  if (tag.structures.empty() || tag.triggers.empty()) {
    return absl::InvalidArgumentError("a structural tag needs structures and triggers");
  }
  const StructuralTag encoded = Encoded(tag);
  if (tag.at_start) return CompileAtStart(encoded, options);
  return CompileAnywhere(encoded, options);
}

absl::StatusOr<Grammar> AfterReasoning(const Grammar& inner, absl::string_view start,
                                       absl::string_view end, bool opened) {
  if (end.empty() || end.size() > kMaxTriggerBytes || start.size() > kMaxTriggerBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "reasoning: the block's end must be 1..", kMaxTriggerBytes, " bytes, its start at most ",
        kMaxTriggerBytes));
  }
  if (start.empty() && !opened) {
    return absl::InvalidArgumentError("reasoning: a block the prompt did not open needs a start");
  }
  Grammar g;
  const TriggerAutomaton automaton({std::string(end)});
  const size_t n = automaton.next.size();
  std::vector<uint32_t> rule(n);
  for (size_t s = 0; s < n; ++s) rule[s] = g.NewRule(absl::StrCat("reasoning_", s));
  const uint32_t answer = g.Import(inner);
  const uint32_t newlines = g.AddChoice("after_reasoning", {{}, g.Literal("\n"), g.Literal("\n\n")});
  for (size_t s = 0; s < n; ++s) {
    if (!automaton.ends[s].empty()) {  // the block just closed: the answer
      g.AddAlternative(rule[s], {Grammar::Ref(newlines), Grammar::Ref(answer)});
      continue;
    }
    // Inside the block: no empty alternative, the output may not end before the answer; no
    // special token (TextBytes).
    std::map<uint32_t, ByteSet> by_target;
    for (int b = 0; b < 256; ++b) {
      if (b != kSpecialTokenMark) by_target[automaton.next[s][b]].set(static_cast<size_t>(b));
    }
    for (const auto& [target, bytes] : by_target) {
      g.AddAlternative(rule[s], {g.Bytes(bytes), Grammar::Ref(rule[target])});
    }
  }
  if (opened) {
    g.set_root(rule[0]);
  } else {
    const uint32_t root = g.NewRule("root");
    Grammar::Sequence block = g.Literal(start);
    block.push_back(Grammar::Ref(rule[0]));
    g.AddAlternative(root, std::move(block));
    g.AddAlternative(root, {Grammar::Ref(answer)});
    g.set_root(root);
  }
  PD_RETURN_IF_ERROR(g.Validate());
  return g;
}

}  // namespace pd::grammar
