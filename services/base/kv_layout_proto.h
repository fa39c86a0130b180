// The wire form of a worker's KV layout (pdserve.internal.v1.KvLayout) and the check both ends
// of a KV exchange make before any byte moves: prefill and decode workers at the hand-off,
// pd-tierd and a worker at Attach. Shared here so that pd-tierd needs nothing of pd-worker.
//
// Thread-safety: plain functions without state.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "engine/kvcache/kv_layout.h"
#include "pd/v1/worker.pb.h"
#include "services/base/kv_dtype_proto.h"

namespace pd::services {

// Bumped when the block byte layout (KvLayout::block_bytes order) or the prefill/decode
// hand-off protocol changes; both ends must agree.
inline constexpr uint32_t kHandoffProtocolVersion = 1;
inline constexpr uint32_t kLayoutVersion = 1;

// The wire form of `layout` for a model with `fingerprint` (hex), stamped with the versions
// above. A KV dtype without a proto value becomes KV_DTYPE_UNSPECIFIED (never equal to a real
// one in CheckLayout).
pdserve::internal::v1::KvLayout LayoutToProto(const kvcache::KvLayout& layout,
                                              const std::string& fingerprint);

// OK when `theirs` equals `mine`; FailedPrecondition listing every differing field with both
// values ("kv layout mismatch: block_size prefill=16 decode=32").
absl::Status CheckLayout(const pdserve::internal::v1::KvLayout& mine,
                         const pdserve::internal::v1::KvLayout& theirs, absl::string_view mine_name,
                         absl::string_view theirs_name);

}  // namespace pd::services
