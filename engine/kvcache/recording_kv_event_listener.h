// RecordingKvEventListener: a KvEventListener that records every event in order, for tests (of
// this folder and of the scheduler/worker on top) and for debugging.
//
// Thread-safety: thread-compatible, like the pool that calls it.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/types/span.h"
#include "common/hash/block_hash.h"
#include "engine/kvcache/kv_event_listener.h"

namespace pd::kvcache {

class RecordingKvEventListener : public KvEventListener {
 public:
  struct Event {
    enum class Kind { kStored, kRemoved, kAllCleared };
    Kind kind = Kind::kStored;
    std::vector<BlockHash> hashes;    // empty for kAllCleared
    std::optional<BlockHash> parent;  // kStored only
  };

  void OnBlocksStored(absl::Span<const BlockHash> hashes,
                      std::optional<BlockHash> parent) override {
    events_.push_back({Event::Kind::kStored, {hashes.begin(), hashes.end()}, parent});
    for (const BlockHash& h : hashes) {
      num_inconsistent_ += held_.insert(h).second ? 0 : 1;
    }
  }
  void OnBlocksRemoved(absl::Span<const BlockHash> hashes) override {
    events_.push_back({Event::Kind::kRemoved, {hashes.begin(), hashes.end()}, std::nullopt});
    for (const BlockHash& h : hashes) {
      num_inconsistent_ += held_.erase(h) == 1 ? 0 : 1;
    }
  }
  void OnAllCleared() override {
    events_.push_back({Event::Kind::kAllCleared, {}, std::nullopt});
    held_.clear();
  }

  const std::vector<Event>& events() const { return events_; }
  // Forgets the recorded events (not the replayed set below).
  void Clear() { events_.clear(); }

  // The set of hashes a subscriber that saw every event so far believes the pool holds
  // (Stored adds, Removed erases, AllCleared empties), maintained as events arrive.
  const absl::flat_hash_set<BlockHash>& Replay() const { return held_; }
  // Hashes reported stored while already held, or removed while not held: 0 for a correct pool.
  int64_t num_inconsistent() const { return num_inconsistent_; }

 private:
  std::vector<Event> events_;
  absl::flat_hash_set<BlockHash> held_;
  int64_t num_inconsistent_ = 0;
};

}  // namespace pd::kvcache
