// AdmissionGuard: decides which blocks leaving DRAM are worth an NVMe write (issue #6 item 3).
//
// Rule: a block goes to NVMe only if it was *seen at least twice* (min_count) while tierd
// knew of it: offered by a worker (AllocateSlots, including offers answered ALREADY_HELD) or
// served by Promote. Everything else is dropped when it leaves DRAM. Most evicted prefixes are
// one-off prompts that will never be asked for again; writing them would wear the disk and
// push out blocks that do come back. A block that comes back once is likely to come back again
// (shared system prompts, multi-turn conversations), and it pays its NVMe write the second time
// it is seen.
//
// The counts are kept by hash, not by DRAM slot, so they survive the block's eviction: a prefix
// dropped after its first visit is written to NVMe after its second. They live in a count-min
// sketch (depth 4, byte counters saturating at 15, conservative update) of a fixed size, so
// memory is bounded whatever the key space: 16 bytes per expected distinct block. Every
// 8 * expected_blocks records all counters are halved (TinyLFU's reset), so old popularity fades
// and the sketch keeps tracking what is hot now. The sketch can only over-count (hash collisions),
// never under-count, except that halving may turn a single old visit into none: a block seen
// twice long ago may need one more visit. Over-counting admits a few one-hit blocks; it never
// refuses a block really seen twice recently.
//
// Why not something else: LRU alone writes every evicted block (the wear the issue forbids);
// an exact per-hash counter map grows without bound; comparing the candidate with the NVMe
// victim (full TinyLFU) matters only when NVMe is full, and NVMe is much larger than DRAM, so
// the plain threshold gets most of the benefit with less coupling.
//
// Thread-safety: thread-safe (one internal mutex; every call is O(depth)).
#pragma once

#include <cstdint>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "common/hash/block_hash.h"

namespace pd::tierd {

struct AdmissionGuardConfig {
  // About how many distinct blocks to track between two halvings (size the sketch as a few
  // times the DRAM pool's slots). In [1, 2^28]; rounded up to a power of two.
  int64_t expected_blocks = 1 << 16;
  // Visits needed before a block may be written to NVMe. In [1, 15]; 1 admits everything.
  int min_count = 2;

  // InvalidArgument naming the bad field.
  absl::Status Validate() const;
};

struct AdmissionGuardStats {
  uint64_t records_total = 0;   // Record calls
  uint64_t admitted_total = 0;  // Admit calls answering true
  uint64_t rejected_total = 0;  // Admit calls answering false
  uint64_t resets_total = 0;    // halvings
};

class AdmissionGuard {
 public:
  // `config` must be valid (CHECKed; validate flags first).
  explicit AdmissionGuard(AdmissionGuardConfig config = {});

  // Counts one visit of `hash`.
  void Record(const BlockHash& hash);
  // Estimated visits of `hash` (>= the true recent count, capped at 15).
  int Estimate(const BlockHash& hash) const;
  // Whether a block leaving DRAM should be written to NVMe: Estimate >= min_count. Counted in
  // the stats.
  bool Admit(const BlockHash& hash);

  AdmissionGuardStats Stats() const;

 private:
  static constexpr int kDepth = 4;
  static constexpr uint8_t kMaxCount = 15;

  // Counter index of `hash` in row `row`.
  size_t IndexOf(const BlockHash& hash, int row) const;
  int EstimateLocked(const BlockHash& hash) const ABSL_SHARED_LOCKS_REQUIRED(mu_);

  const AdmissionGuardConfig config_;
  const size_t width_;     // counters per row: a power of two >= 4 * expected_blocks
  const uint64_t sample_;  // records between halvings (2 * width_)

  mutable absl::Mutex mu_;
  std::vector<uint8_t> counters_ ABSL_GUARDED_BY(mu_);  // [kDepth][width_]
  uint64_t since_reset_ ABSL_GUARDED_BY(mu_) = 0;
  AdmissionGuardStats stats_ ABSL_GUARDED_BY(mu_);
};

}  // namespace pd::tierd
