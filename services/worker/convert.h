// Conversions between the worker's protos (pd/v1/generation.proto) and
// engine types. The only place in pd-worker where protobuf meets the engine (the KV layout's
// wire form is services/base/kv_layout_proto.h, shared with pd-tierd).
#pragma once

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/scheduler/request.h"
#include "pd/v1/generation.pb.h"

namespace pd::worker {

// Sampling parameters as the engine takes them. InvalidArgument naming the field for values
// out of range (temperature < 0 or not finite, top_p outside [0, 1], min_tokens > max_tokens,
// min_p outside [0, 1], presence or frequency penalty outside [-2, 2], a repetition penalty
// < 0 or not finite, a logit_bias value outside [-100, 100]). logit_bias ids are the engine's
// to check against the vocabulary (Scheduler::Submit).
absl::StatusOr<engine::SamplingOptions> SamplingFromProto(const pdserve::v1::SamplingParams& p);

pdserve::v1::FinishReason FinishReasonToProto(engine::FinishReason reason);

// A generated token's logprob entry on the wire and back. FromProto checks nothing: the
// scheduler validates the entry (CompleteRemotePrefill) against what the request asked.
void TokenLogprobToProto(const engine::TokenLogprob& in, pdserve::v1::TokenLogprob* out);
engine::TokenLogprob TokenLogprobFromProto(const pdserve::v1::TokenLogprob& in);

}  // namespace pd::worker
