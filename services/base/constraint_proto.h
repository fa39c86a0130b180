// pdserve.v1.OutputConstraint <-> the grammar engine's ConstraintSpec, shared by the router
// (which compiles a request's constraint to refuse a bad one before any worker sees it) and the
// workers (which compile it to sample with it).
#pragma once

#include "absl/status/statusor.h"
#include "engine/grammar/constraint.h"
#include "pd/v1/generation.pb.h"

namespace pd::services {

// The constraint of `sampling` (kind kNone when unset). Errors: InvalidArgument naming the
// field (sampling.constraint.*) for json_object false, text that is not UTF-8 or over
// grammar::kMaxConstraintBytes, or a choice list that is empty or too long.
absl::StatusOr<grammar::ConstraintSpec> ConstraintFromProto(
    const pdserve::v1::SamplingParams& sampling);

// Compiles the constraint of `sampling` through `cache` (null when there is none). Errors as
// ConstraintFromProto, then as grammar::CompileConstraint with the field named.
absl::StatusOr<std::shared_ptr<const grammar::CompiledGrammar>> CompileConstraintOf(
    const pdserve::v1::SamplingParams& sampling, grammar::GrammarCache* cache);

}  // namespace pd::services
