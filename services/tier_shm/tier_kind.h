// TierKind: the tier a block below the worker comes from (tierd.proto's TIER_DRAM, TIER_NVME),
// as pd-tierd's store reports it and a worker's promoted run names it.
#pragma once

#include <cstdint>

namespace pd::tier_shm {

enum class TierKind : uint8_t { kDram, kNvme };

}  // namespace pd::tier_shm
