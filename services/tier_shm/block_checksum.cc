#include "services/tier_shm/block_checksum.h"

#include <xxhash.h>

namespace pd::tier_shm {

uint64_t BlockChecksum(absl::Span<const uint8_t> block) {
  return XXH3_64bits(block.data(), block.size());
}

}  // namespace pd::tier_shm
