#include "services/base/constraint_proto.h"

#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/utf8/utf8.h"

namespace pd::services {
namespace {

absl::Status Invalid(absl::string_view field, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat("sampling.constraint.", field, ": ", why));
}

absl::Status CheckText(absl::string_view field, const std::string& text) {
  if (text.size() > grammar::kMaxConstraintBytes) {
    return Invalid(
        field, absl::StrCat(text.size(), " bytes exceed the limit ", grammar::kMaxConstraintBytes));
  }
  if (!utf8::IsValid(text)) {
    return Invalid(field, "is not valid UTF-8");
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<grammar::ConstraintSpec> ConstraintFromProto(
    const pdserve::v1::SamplingParams& sampling) {
  using pdserve::v1::OutputConstraint;
  grammar::ConstraintSpec spec;
  if (!sampling.has_constraint()) return spec;
  const OutputConstraint& c = sampling.constraint();
  switch (c.kind_case()) {
    case OutputConstraint::kJsonSchema:
      if (auto s = CheckText("json_schema", c.json_schema()); !s.ok()) return s;
      spec.kind = grammar::ConstraintSpec::Kind::kJsonSchema;
      spec.text = c.json_schema();
      break;
    case OutputConstraint::kJsonObject:
      if (!c.json_object()) return Invalid("json_object", "must be true when set");
      spec.kind = grammar::ConstraintSpec::Kind::kJsonObject;
      break;
    case OutputConstraint::kRegex:
      if (auto s = CheckText("regex", c.regex()); !s.ok()) return s;
      spec.kind = grammar::ConstraintSpec::Kind::kRegex;
      spec.text = c.regex();
      break;
    case OutputConstraint::kGrammar:
      if (auto s = CheckText("grammar", c.grammar()); !s.ok()) return s;
      spec.kind = grammar::ConstraintSpec::Kind::kGrammar;
      spec.text = c.grammar();
      break;
    case OutputConstraint::kStructuralTag:
      if (auto s = CheckText("structural_tag", c.structural_tag()); !s.ok()) return s;
      spec.kind = grammar::ConstraintSpec::Kind::kStructuralTag;
      spec.text = c.structural_tag();
      break;
    case OutputConstraint::kChoice: {
      const auto& values = c.choice().values();
      if (values.empty() || static_cast<size_t>(values.size()) > grammar::kMaxChoices) {
        return Invalid("choice", absl::StrCat("needs 1..", grammar::kMaxChoices, " values, got ",
                                              values.size()));
      }
      size_t total = 0;
      for (int i = 0; i < values.size(); ++i) {
        const std::string field = absl::StrCat("choice.values[", i, "]");
        if (auto s = CheckText(field, values[i]); !s.ok()) return s;
        total += values[i].size();
      }
      if (total > grammar::kMaxConstraintBytes) {
        return Invalid("choice", absl::StrCat(total, " bytes of values exceed the limit ",
                                              grammar::kMaxConstraintBytes));
      }
      spec.kind = grammar::ConstraintSpec::Kind::kChoice;
      spec.choices.assign(values.begin(), values.end());
      break;
    }
    case OutputConstraint::KIND_NOT_SET:
      return Invalid("kind", "set one of json_schema, json_object, regex, choice, grammar or structural_tag");
  }
  if (c.has_reasoning()) {
    const OutputConstraint::Reasoning& r = c.reasoning();
    if (auto s = CheckText("reasoning.start", r.start()); !s.ok()) return s;
    if (auto s = CheckText("reasoning.end", r.end()); !s.ok()) return s;
    if (r.end().empty() || r.end().size() > 64 || r.start().size() > 64 ||
        (r.start().empty() && !r.opened())) {
      return Invalid("reasoning",
                     "needs an end of 1..64 bytes and a start of at most 64 (required unless "
                     "opened)");
    }
    spec.reasoning_start = r.start();
    spec.reasoning_end = r.end();
    spec.reasoning_opened = r.opened();
  }
  if (sampling.min_tokens() > 0 || sampling.ignore_eos()) {
    return absl::InvalidArgumentError(
        "sampling.constraint: cannot be combined with min_tokens or ignore_eos (the constraint "
        "decides where the output ends)");
  }
  return spec;
}

absl::StatusOr<std::shared_ptr<const grammar::CompiledGrammar>> CompileConstraintOf(
    const pdserve::v1::SamplingParams& sampling, grammar::GrammarCache* cache) {
  absl::StatusOr<grammar::ConstraintSpec> spec = ConstraintFromProto(sampling);
  if (!spec.ok()) return spec.status();
  if (spec->kind == grammar::ConstraintSpec::Kind::kNone) {
    return std::shared_ptr<const grammar::CompiledGrammar>();
  }
  absl::StatusOr<std::shared_ptr<const grammar::CompiledGrammar>> g =
      cache != nullptr ? cache->Get(*spec) : grammar::CompileConstraint(*spec);
  if (!g.ok()) {
    return absl::Status(g.status().code(), absl::StrCat("sampling.constraint.",
                                                        grammar::ConstraintKindName(spec->kind),
                                                        ": ", g.status().message()));
  }
  return g;
}

}  // namespace pd::services
