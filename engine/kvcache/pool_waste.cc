#include "engine/kvcache/pool_waste.h"

#include <algorithm>

#include "absl/container/flat_hash_map.h"

namespace pd::kvcache {

PoolWaste MeasurePoolWaste(const KvCacheManager& manager) {
  const int64_t block_size = manager.block_size();
  // Physical block -> slots filled in it (the max over tables sharing it).
  absl::flat_hash_map<BlockId, int64_t> filled;
  manager.ForEachSequence([&](SequenceId, const BlockTable& table) {
    for (int64_t i = 0; i < table.num_blocks(); ++i) {
      const int64_t used = std::min(block_size, table.num_tokens() - i * block_size);
      int64_t& slot = filled[table.blocks()[i]];
      slot = std::max(slot, used);
    }
  });
  PoolWaste waste;
  waste.num_blocks = static_cast<int64_t>(filled.size());
  waste.allocated_slots = waste.num_blocks * block_size;
  for (const auto& [block, used] : filled) {
    waste.stored_tokens += used;
  }
  return waste;
}

}  // namespace pd::kvcache
