// Conversions between the worker's protos (pd/v1/generation.proto, pd/v1/worker.proto) and
// engine types. The only place in pd-worker where protobuf meets the engine.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "common/hash/block_hash.h"
#include "engine/kvcache/kv_layout.h"
#include "engine/scheduler/request.h"
#include "pd/v1/generation.pb.h"
#include "pd/v1/worker.pb.h"

namespace pd::worker {

inline constexpr uint32_t kHandoffProtocolVersion = 1;
inline constexpr uint32_t kLayoutVersion = 1;

// Sampling parameters as the engine takes them. InvalidArgument naming the field for values
// out of range (temperature < 0 or not finite, top_p outside [0, 1], min_tokens > max_tokens).
absl::StatusOr<engine::SamplingOptions> SamplingFromProto(const pdserve::v1::SamplingParams& p);

pdserve::v1::FinishReason FinishReasonToProto(engine::FinishReason reason);

// The wire form of a worker's KV layout.
pdserve::internal::v1::KvLayout LayoutToProto(const kvcache::KvLayout& layout,
                                              const std::string& fingerprint);

// OK when `theirs` equals `mine`; FailedPrecondition listing every differing field with both
// values ("kv layout mismatch: block_size prefill=16 decode=32").
absl::Status CheckLayout(const pdserve::internal::v1::KvLayout& mine,
                         const pdserve::internal::v1::KvLayout& theirs, absl::string_view mine_name,
                         absl::string_view theirs_name);

// `text` with every byte that is not part of a well-formed UTF-8 character replaced by U+FFFD
// (one per maximal ill-formed subsequence, as Unicode recommends), so that it fits a proto
// `string` field: the detokenizer passes bytes through when a model's tokens do not form
// UTF-8, and a string field holding them fails to parse on the receiving side.
std::string ToValidUtf8(std::string text);

// 16 bytes per hash, in order (BlockHash::ToBytes).
std::string HashesToBytes(absl::Span<const BlockHash> hashes);

}  // namespace pd::worker
