// The block checksum every tier records and verifies (the one proto/pd/v1/tierd.proto names):
// a worker computes it for CommitEntry.checksum and verifies its copies of a promoted block
// against PromotedBlock.checksum; pd-tierd verifies commits, spills and NVMe reads with it.
//
// Pure function; thread-safe.
#pragma once

#include <cstdint>

#include "absl/types/span.h"

namespace pd::tier_shm {

// XXH3-64 with seed 0 of a block's bytes (its block_bytes, never the slot padding).
uint64_t BlockChecksum(absl::Span<const uint8_t> block);

}  // namespace pd::tier_shm
