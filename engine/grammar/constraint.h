// The structured-output constraint of one request, as the API states it (a JSON Schema, any
// JSON object, a regular expression, a list of choices), compiled to a grammar. Workers cache
// compiled grammars: agent traffic repeats the same few schemas, and a compile costs far more
// than a lookup.
#pragma once

#include <cstddef>
#include <list>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "engine/grammar/matcher.h"

namespace pd::grammar {

struct ConstraintSpec {
  enum class Kind { kNone, kJsonSchema, kJsonObject, kRegex, kChoice, kGrammar, kStructuralTag };
  Kind kind = Kind::kNone;
  // kJsonSchema: the schema (JSON); kRegex: the pattern; kGrammar: GBNF (gbnf.h);
  // kStructuralTag: the tag as JSON (structural_tag.h)
  std::string text;
  std::vector<std::string> choices;  // kChoice: the output is exactly one of these
  // A reasoning model's block before the constrained answer (AfterReasoning in
  // structural_tag.h): set when reasoning_end is not empty.
  std::string reasoning_start;
  std::string reasoning_end;
  bool reasoning_opened = false;
};

// Largest schema or pattern text, and most choices (each at most kMaxConstraintBytes too).
inline constexpr size_t kMaxConstraintBytes = size_t{1} << 20;
inline constexpr size_t kMaxChoices = 4096;
// Whitespace bytes allowed at each place JSON allows whitespace, for json_schema and
// json_object constraints: one (a space or a newline after a comma, say), never a run. Small
// models otherwise spend their tokens on runs of newlines up to any larger bound.
inline constexpr int kConstraintMaxWhitespace = 1;

// "json_schema", "json_object", "regex", "choice", "grammar", "structural_tag" or "none".
const char* ConstraintKindName(ConstraintSpec::Kind kind);

// Compiles `spec` (kind not kNone). Errors: InvalidArgument naming what is wrong (a keyword
// this engine cannot enforce, a pattern that does not parse, a text over the limits, an empty
// choice list); OutOfRange when the schema is valid but no document satisfies it.
absl::StatusOr<std::shared_ptr<const CompiledGrammar>> CompileConstraint(
    const ConstraintSpec& spec);

// A bounded cache of compiled constraints by their full text (least recently used out first):
// at most `capacity` entries holding at most `max_bytes` (CompiledGrammar::ByteSize plus the
// key), so that distinct huge schemas cannot pin a process's memory. Only successful compiles
// are kept. Thread-safe; a compile runs outside the lock.
class GrammarCache {
 public:
  explicit GrammarCache(size_t capacity = 256, size_t max_bytes = size_t{256} << 20)
      : capacity_(capacity), max_bytes_(max_bytes) {}

  absl::StatusOr<std::shared_ptr<const CompiledGrammar>> Get(const ConstraintSpec& spec);

  struct Stats {
    int64_t hits = 0;
    int64_t misses = 0;
    int64_t entries = 0;
    int64_t bytes = 0;
  };
  Stats stats() const;

 private:
  using Entry = std::pair<std::string, size_t>;  // key, bytes
  struct Cached {
    std::shared_ptr<const CompiledGrammar> grammar;
    size_t bytes = 0;
  };
  const size_t capacity_;
  const size_t max_bytes_;
  mutable absl::Mutex mu_;
  std::list<Entry> lru_ ABSL_GUARDED_BY(mu_);  // most recent first
  absl::flat_hash_map<std::string, std::pair<std::list<Entry>::iterator, Cached>> index_
      ABSL_GUARDED_BY(mu_);
  size_t bytes_ ABSL_GUARDED_BY(mu_) = 0;
  Stats stats_ ABSL_GUARDED_BY(mu_);
};

}  // namespace pd::grammar
