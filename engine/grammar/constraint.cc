#include "engine/grammar/constraint.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "engine/grammar/gbnf.h"
#include "engine/grammar/json_schema.h"
#include "engine/grammar/regex.h"
#include "engine/grammar/structural_tag.h"

namespace pd::grammar {
namespace {

JsonSchemaOptions JsonOptions() {
  JsonSchemaOptions o;
  o.max_whitespace = kConstraintMaxWhitespace;
  return o;
}

absl::StatusOr<Grammar> BuildGrammar(const ConstraintSpec& spec) {
  switch (spec.kind) {
    case ConstraintSpec::Kind::kNone:
      return absl::InvalidArgumentError("constraint: no constraint to compile");
    case ConstraintSpec::Kind::kJsonSchema:
      return CompileJsonSchema(spec.text, JsonOptions());
    case ConstraintSpec::Kind::kJsonObject:
      return AnyJsonGrammar(/*object_only=*/true, JsonOptions());
    case ConstraintSpec::Kind::kRegex: {
      Grammar g;
      RegexOptions options;
      options.search = false;
      absl::StatusOr<uint32_t> root = CompileRegex(spec.text, options, &g);
      if (!root.ok()) {
        return absl::InvalidArgumentError(absl::StrCat("regex: ", root.status().message()));
      }
      g.set_root(*root);
      return g;
    }
    case ConstraintSpec::Kind::kGrammar:
      return CompileGbnf(spec.text);
    case ConstraintSpec::Kind::kStructuralTag: {
      PD_ASSIGN_OR_RETURN(StructuralTag tag, ParseStructuralTag(spec.text));
      return CompileStructuralTag(tag, JsonOptions());
    }
    case ConstraintSpec::Kind::kChoice: {
      if (spec.choices.empty()) {
        return absl::InvalidArgumentError("choice: the list of choices is empty");
      }
      Grammar g;
      std::vector<Grammar::Sequence> alternatives;
      for (const std::string& c : spec.choices) alternatives.push_back(g.Literal(c));
      g.set_root(g.AddChoice("choice", std::move(alternatives)));
      return g;
    }
  }
  return absl::InvalidArgumentError("constraint: unknown kind");
}

}  // namespace

const char* ConstraintKindName(ConstraintSpec::Kind kind) {
  switch (kind) {
    case ConstraintSpec::Kind::kNone:
      return "none";
    case ConstraintSpec::Kind::kJsonSchema:
      return "json_schema";
    case ConstraintSpec::Kind::kJsonObject:
      return "json_object";
    case ConstraintSpec::Kind::kRegex:
      return "regex";
    case ConstraintSpec::Kind::kChoice:
      return "choice";
    case ConstraintSpec::Kind::kGrammar:
      return "grammar";
    case ConstraintSpec::Kind::kStructuralTag:
      return "structural_tag";
  }
  return "unknown";
}

absl::StatusOr<std::shared_ptr<const CompiledGrammar>> CompileConstraint(
    const ConstraintSpec& spec) {
  if (spec.text.size() > kMaxConstraintBytes) {
    return absl::InvalidArgumentError(absl::StrCat(ConstraintKindName(spec.kind), ": ",
                                                   spec.text.size(), " bytes, at most ",
                                                   kMaxConstraintBytes));
  }
  if (spec.choices.size() > kMaxChoices) {
    return absl::InvalidArgumentError(
        absl::StrCat("choice: ", spec.choices.size(), " choices, at most ", kMaxChoices));
  }
  size_t choice_bytes = 0;
  for (const std::string& c : spec.choices) choice_bytes += c.size();
  if (choice_bytes > kMaxConstraintBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("choice: ", choice_bytes, " bytes of choices, at most ", kMaxConstraintBytes));
  }
  PD_ASSIGN_OR_RETURN(Grammar g, BuildGrammar(spec));
  if (!spec.reasoning_end.empty()) {
    PD_ASSIGN_OR_RETURN(g, AfterReasoning(g, spec.reasoning_start, spec.reasoning_end,
                                          spec.reasoning_opened));
  }
  PD_ASSIGN_OR_RETURN(std::shared_ptr<const CompiledGrammar> compiled, CompiledGrammar::Compile(g));
  // A grammar the matcher cannot even start (more alternatives open at once than its bound, as
  // an enum of 50,000 values) would fail every request at its first token: refuse it here.
  if (const Matcher start(compiled); start.overflowed()) {
    return absl::InvalidArgumentError(absl::StrCat(
        ConstraintKindName(spec.kind), ": more than ", Matcher::kMaxStacks,
        " alternatives are open at the start of the output (an enum, anyOf or choice list that "
        "long); the matcher's bound is ",
        Matcher::kMaxStacks));
  }
  return compiled;
}

absl::StatusOr<std::shared_ptr<const CompiledGrammar>> GrammarCache::Get(
    const ConstraintSpec& spec) {
  std::string key =
      absl::StrCat(ConstraintKindName(spec.kind), ":", spec.text.size(), ":", spec.text);
  for (const std::string& c : spec.choices) absl::StrAppend(&key, ":", c.size(), ":", c);
  if (!spec.reasoning_end.empty()) {
    absl::StrAppend(&key, ":reasoning:", spec.reasoning_opened ? 1 : 0, ":",
                    spec.reasoning_start.size(), ":", spec.reasoning_start, ":",
                    spec.reasoning_end);
  }
  {
    absl::MutexLock lock(&mu_);
    auto it = index_.find(key);
    if (it != index_.end()) {
      lru_.splice(lru_.begin(), lru_, it->second.first);
      ++stats_.hits;
      return it->second.second.grammar;
    }
    ++stats_.misses;
  }
  PD_ASSIGN_OR_RETURN(std::shared_ptr<const CompiledGrammar> compiled, CompileConstraint(spec));
  absl::MutexLock lock(&mu_);
  const size_t bytes = compiled->ByteSize() + 2 * key.size();
  if (index_.contains(key) || capacity_ == 0 || bytes > max_bytes_) return compiled;
  lru_.emplace_front(key, bytes);
  index_[key] = {lru_.begin(), Cached{compiled, bytes}};
  bytes_ += bytes;
  while (lru_.size() > capacity_ || bytes_ > max_bytes_) {
    bytes_ -= lru_.back().second;
    index_.erase(lru_.back().first);
    lru_.pop_back();
  }
  stats_.entries = static_cast<int64_t>(lru_.size());
  stats_.bytes = static_cast<int64_t>(bytes_);
  return compiled;
}

GrammarCache::Stats GrammarCache::stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

}  // namespace pd::grammar
