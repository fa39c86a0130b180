// The CRC that guards each record of pd-tierd's NVMe manifest. (The block checksum every tier
// records and verifies is services/tier_shm/block_checksum.h, shared with the workers.)
//
// Pure functions; thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>

#include "absl/types/span.h"

namespace pd::tierd {

// CRC-32C (Castagnoli, reflected, initial and final xor 0xffffffff) of `bytes`; guards manifest
// records and the manifest header. Crc32c("123456789") == 0xe3069283.
uint32_t Crc32c(absl::Span<const uint8_t> bytes);

}  // namespace pd::tierd
