#include "services/tier_shm/dram_slots.h"

#include "absl/strings/str_cat.h"

namespace pd::tier_shm {

int64_t SlotBytesFor(int64_t block_bytes) {
  return (block_bytes + kSlotAlignBytes - 1) / kSlotAlignBytes * kSlotAlignBytes;
}

absl::StatusOr<std::unique_ptr<ShmRegion>> MapDramPool(absl::string_view shm_name,
                                                       int64_t num_slots, int64_t slot_bytes) {
  size_t size_bytes = 0;
  if (num_slots < 1 || num_slots > kMaxDramSlots || slot_bytes < kSlotAlignBytes ||
      slot_bytes % kSlotAlignBytes != 0 ||
      __builtin_mul_overflow(static_cast<size_t>(num_slots), static_cast<size_t>(slot_bytes),
                             &size_bytes)) {
    return absl::InvalidArgumentError(absl::StrCat("dram pool ", shm_name, ": bad geometry ",
                                                   num_slots, " slots of ", slot_bytes, " bytes"));
  }
  return ShmRegion::MapExisting(shm_name, size_bytes);
}

}  // namespace pd::tier_shm
