// An LRU list threaded through a vector of slots by index (each slot has uint32_t `prev` and
// `next`; kSlotNone ends the list), shared by DramPool and NvmeStore. Not thread-safe: callers
// hold their own lock.
#pragma once

#include <cstdint>

namespace pd::tierd {

inline constexpr uint32_t kSlotNone = ~uint32_t{0};

// Puts slot `s` (not in the list) at the most recently used end (`head`).
template <typename Slots>
void SlotLruLinkFront(Slots& slots, uint32_t s, uint32_t& head, uint32_t& tail) {
  auto& slot = slots[s];
  slot.prev = kSlotNone;
  slot.next = head;
  if (head != kSlotNone) {
    slots[head].prev = s;
  }
  head = s;
  if (tail == kSlotNone) {
    tail = s;
  }
}

// Takes slot `s` out of the list.
template <typename Slots>
void SlotLruUnlink(Slots& slots, uint32_t s, uint32_t& head, uint32_t& tail) {
  auto& slot = slots[s];
  if (slot.prev != kSlotNone) {
    slots[slot.prev].next = slot.next;
  } else {
    head = slot.next;
  }
  if (slot.next != kSlotNone) {
    slots[slot.next].prev = slot.prev;
  } else {
    tail = slot.prev;
  }
  slot.prev = slot.next = kSlotNone;
}

}  // namespace pd::tierd
