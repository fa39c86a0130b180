// LocalBlockSet: a thread-safe copy of the hashes a worker's pool can hit, kept from the pool's
// KV events (it forwards every event to the next listener, e.g. the KV event publisher). gRPC
// threads read it to know where the pool's cached prefix of a prompt ends, so they ask the
// node's tiers only for what follows. It is a hint: the scheduler re-checks at admission.
//
// Thread-safety: the listener callbacks run on the scheduler thread; LeadingMatch on any thread.
#pragma once

#include <cstdint>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/synchronization/mutex.h"
#include "engine/kvcache/kv_event_listener.h"

namespace pd::worker {

class LocalBlockSet final : public kvcache::KvEventListener {
 public:
  // `next` (may be null) receives every event after this set applied it; not owned.
  explicit LocalBlockSet(kvcache::KvEventListener* next) : next_(next) {}

  void OnBlocksStored(absl::Span<const BlockHash> hashes,
                      std::optional<BlockHash> parent) override {
    {
      absl::MutexLock lock(&mu_);
      hashes_.insert(hashes.begin(), hashes.end());
    }
    if (next_ != nullptr) next_->OnBlocksStored(hashes, parent);
  }

  void OnBlocksRemoved(absl::Span<const BlockHash> hashes) override {
    {
      absl::MutexLock lock(&mu_);
      for (const BlockHash& h : hashes) hashes_.erase(h);
    }
    if (next_ != nullptr) next_->OnBlocksRemoved(hashes);
  }

  void OnAllCleared() override {
    {
      absl::MutexLock lock(&mu_);
      hashes_.clear();
    }
    if (next_ != nullptr) next_->OnAllCleared();
  }

  // How many leading hashes of `chain` the pool holds now.
  int64_t LeadingMatch(absl::Span<const BlockHash> chain) const {
    absl::MutexLock lock(&mu_);
    int64_t n = 0;
    while (n < static_cast<int64_t>(chain.size()) && hashes_.contains(chain[n])) ++n;
    return n;
  }

 private:
  kvcache::KvEventListener* const next_;
  mutable absl::Mutex mu_;
  absl::flat_hash_set<BlockHash> hashes_ ABSL_GUARDED_BY(mu_);
};

}  // namespace pd::worker
