// The DRAM tier's slot layout: what pd-tierd (which creates the pool, services/tierd/dram_pool.h)
// and the node's workers (which map it, services/tier_client) must agree on byte for byte.
//
// The pool is one POSIX shared-memory object (ShmRegion) of num_slots slots. Slot i occupies
// bytes [i * slot_bytes, i * slot_bytes + block_bytes) of it; slot_bytes is block_bytes rounded
// up to kSlotAlignBytes, so every slot is page-aligned and can be the buffer of an O_DIRECT read
// or write without a bounce copy. AttachResponse (proto/pd/v1/tierd.proto) reports shm_name,
// num_slots and slot_bytes; a worker maps the pool from exactly those.
//
// Pure functions and constants; thread-safe.
#pragma once

#include <cstdint>
#include <limits>
#include <memory>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "services/tier_shm/shm_region.h"

namespace pd::tier_shm {

// Alignment and granularity of slots (and of NVMe I/O).
inline constexpr int64_t kSlotAlignBytes = 4096;
// Most slots a pool may have: slot numbers are uint32 on the wire, and one value is kept free.
inline constexpr int64_t kMaxDramSlots = int64_t{std::numeric_limits<uint32_t>::max()} - 1;

// `block_bytes` rounded up to kSlotAlignBytes.
int64_t SlotBytesFor(int64_t block_bytes);

// Worker side: maps the pool tierd created, read-write, from the geometry AttachResponse
// reports (num_slots * slot_bytes bytes; slot i starts at i * slot_bytes). Never creates or
// unlinks. Errors as ShmRegion::MapExisting (NotFound: no such pool; FailedPrecondition:
// another size); InvalidArgument for a bad geometry (num_slots outside [1, kMaxDramSlots],
// slot_bytes not a positive multiple of kSlotAlignBytes, or a size that overflows).
absl::StatusOr<std::unique_ptr<ShmRegion>> MapDramPool(absl::string_view shm_name,
                                                       int64_t num_slots, int64_t slot_bytes);

}  // namespace pd::tier_shm
