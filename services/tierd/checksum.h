// Checksums of pd-tierd: the block checksum every tier records and verifies (the one
// tierd.proto names), and the CRC that guards each record of the NVMe manifest.
//
// Pure functions; thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>

#include "absl/types/span.h"

namespace pd::tierd {

// XXH3-64 with seed 0 of a block's bytes (its block_bytes, never the slot padding). The same
// value a worker computes for CommitEntry.checksum and verifies for PromotedBlock.checksum.
uint64_t BlockChecksum(absl::Span<const uint8_t> block);

// CRC-32C (Castagnoli, reflected, initial and final xor 0xffffffff) of `bytes`; guards manifest
// records and the manifest header. Crc32c("123456789") == 0xe3069283.
uint32_t Crc32c(absl::Span<const uint8_t> bytes);

}  // namespace pd::tierd
