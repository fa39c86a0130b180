// KvEventLog: the bookkeeping behind a KV event publisher (proto/pd/v1/kv_events.proto), with
// no gRPC in it: the numbered event history, the set of held blocks, where a resubscribing
// stream can start, and the snapshot of the held set cut into chunks.
//
// Events are numbered 1, 2, 3, ... within one epoch. The history keeps the most recent events,
// bounded by a count and by an estimate of their bytes; the held set (block hash -> parent hash)
// is what folding every event since the start yields, so a snapshot taken together with
// last_sequence() (under the owner's lock) is consistent with the events that follow it.
//
// Every block is reported in one tier, TIER_HBM: a worker publishes its own pool. A stored run
// longer than kMaxHashesPerEvent becomes several consecutive events, each a run of the same
// chain with its parent, so that no event grows past ~256 KiB.
//
// Thread-safety: thread-compatible (the publisher serializes every call under its mutex).
#pragma once

#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/hash/block_hash.h"
#include "pd/v1/kv_events.pb.h"

namespace pd::kv_events {

// Blocks per BlockStored event (16 bytes each: 256 KiB of hashes).
inline constexpr int64_t kMaxHashesPerEvent = 16384;

// Bound on the serialized size of one KvEventBatch the publisher builds (snapshot chunks and
// event batches alike), a little under the ~1 MiB the protocol promises. An event batch always
// carries at least one event, so one batch may exceed it by at most one event (<= ~256 KiB).
inline constexpr int64_t kMaxBatchBytes = (1 << 20) - (32 << 10);

struct KvEventLogConfig {
  // Events kept for replay; > 0.
  int64_t history_events = 100'000;
  // Bound on the estimated bytes of the kept events (hashes plus ~48 bytes each); > 0. The
  // oldest events go first when either bound is reached; the newest event is always kept.
  int64_t history_bytes = 64 << 20;
  // Tokens per block, for BlockStored.num_tokens (blocks * block_size); >= 0, 0 = unknown
  // (num_tokens is then 0).
  int64_t block_size = 0;

  // InvalidArgument naming the field.
  absl::Status Validate() const;
};

// One held block and the block before it in its chain (nullopt: it is block 0 of its chain).
struct HeldBlock {
  BlockHash hash;
  std::optional<BlockHash> parent;
};

// Where a (re)subscribing stream starts.
struct StreamStart {
  // SNAPSHOT_REASON_UNSPECIFIED: replay the events after `sequence` (the subscriber's
  // from_sequence). Otherwise: first send a snapshot of the held set as of `sequence` (the
  // log's last_sequence()), for this reason, then the events after it.
  pdserve::internal::v1::SnapshotReason reason = pdserve::internal::v1::SNAPSHOT_REASON_UNSPECIFIED;
  uint64_t sequence = 0;

  bool replay() const { return reason == pdserve::internal::v1::SNAPSHOT_REASON_UNSPECIFIED; }
};

class KvEventLog {
 public:
  // `config` must be valid (Validate()); `epoch` is the publisher's, non-zero.
  KvEventLog(uint64_t epoch, KvEventLogConfig config);

  uint64_t epoch() const { return epoch_; }

  // Record one change of the pool (KvEventListener's contract): each returns the number of
  // events appended (Stored: one per kMaxHashesPerEvent blocks; 0 for empty `hashes`).
  int Stored(absl::Span<const BlockHash> hashes, std::optional<BlockHash> parent);
  int Removed(absl::Span<const BlockHash> hashes);
  int Cleared();

  // Sequence number of the newest event; 0 before any.
  uint64_t last_sequence() const { return next_sequence_ - 1; }
  // Sequence number of the oldest event still in the history; last_sequence() + 1 when the
  // history is empty.
  uint64_t first_retained_sequence() const { return next_sequence_ - history_.size(); }
  int64_t num_history_events() const { return static_cast<int64_t>(history_.size()); }
  int64_t history_bytes() const { return history_bytes_; }
  int64_t num_held() const { return static_cast<int64_t>(held_.size()); }

  // Where a stream asking to resume after `from_sequence` of `epoch` starts (kv_events.proto,
  // SubscribeRequest): a replay when epoch is this log's and from_sequence is at most
  // last_sequence() with every later event still in the history; otherwise a snapshot at
  // last_sequence() with reason REQUESTED (from_sequence 0), EPOCH_CHANGED (another epoch, or
  // from_sequence ahead of last_sequence()) or HISTORY_TRUNCATED.
  StreamStart Resume(uint64_t epoch, uint64_t from_sequence) const;

  // A copy of the held set, in no particular order.
  std::vector<HeldBlock> HeldBlocks() const;

  // Appends copies of the events after `after` (sequence after + 1, after + 2, ...) to
  // `events`, with worker_id set: at most `max_events` (> 0), and no more once their estimated
  // size reaches `max_bytes` (at least one event is appended when any follows `after`).
  // Returns the number appended, 0 when `after` == last_sequence().
  // Errors: OutOfRange when event after + 1 is no longer in the history (the stream fell
  // behind); InvalidArgument when `after` > last_sequence().
  absl::StatusOr<int> CopyEvents(
      uint64_t after, int max_events, int64_t max_bytes, absl::string_view worker_id,
      google::protobuf::RepeatedPtrField<pdserve::internal::v1::KvEvent>* events) const;

 private:
  // Assigns the next sequence number to `event` and appends it, dropping the oldest events
  // past the bounds.
  void Append(pdserve::internal::v1::KvEvent event, int64_t size_bytes);

  const uint64_t epoch_;
  const KvEventLogConfig config_;
  uint64_t next_sequence_ = 1;
  struct Entry {
    pdserve::internal::v1::KvEvent event;  // worker_id not set
    int64_t size_bytes = 0;
  };
  std::deque<Entry> history_;  // sequences first_retained_sequence() .. last_sequence()
  int64_t history_bytes_ = 0;
  absl::flat_hash_map<BlockHash, std::optional<BlockHash>> held_;
};

// The snapshot of `blocks` as of `sequence`, as the batches of a stream: one or more chunks,
// each a KvEventBatch with worker_id, epoch and snapshot {sequence, reason, blocks, complete}
// set (complete only on the last) and no events, each serializing to at most `max_chunk_bytes`
// (>= 4 KiB). Blocks are grouped into runs of one chain (a block follows its parent in the
// same run when the parent is held and has no other held child); a run that does not fit in a
// chunk continues in the next one, with the last block before the cut as its parent. Every
// block appears exactly once, in TIER_HBM. An empty set gives one empty complete chunk.
std::vector<pdserve::internal::v1::KvEventBatch> BuildSnapshotBatches(
    absl::string_view worker_id, uint64_t epoch, uint64_t sequence,
    pdserve::internal::v1::SnapshotReason reason, std::vector<HeldBlock> blocks, int64_t block_size,
    int64_t max_chunk_bytes = kMaxBatchBytes);

}  // namespace pd::kv_events
