// FaultInjectingTierLink: a TierLink decorator that injects the tier's failures per a
// TierFaultPolicy (the shape of transport's FaultInjectingTransport): offers tierd refuses,
// a tierd that is gone, and restores that fail half-way (the pinned slots were reused, e.g.
// after tierd lost the session while the worker was copying). What is not faulted is
// forwarded to the wrapped link. Runs it hands out wrap the inner link's; Release unwraps them.
//
// Ownership: owns the wrapped link; the decorator must outlive its runs.
// Thread-safety: thread-safe; SetPolicy applies to later calls (a run's failure point is fixed
// when Prepare answers it).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "services/tier_client/tier_link.h"

namespace pd::tier_client {

struct TierFaultPolicy {
  // Offers are refused: not forwarded, `fill` not called, counted as dropped (tierd answered
  // no slot, or refused a disputed block).
  bool refuse_offers = false;
  // tierd is unreachable: Prepare answers nullptr and counts a failed call, offers are dropped,
  // Stats().attached is false.
  bool tierd_gone = false;
  // >= 0: in runs answered from now on, blocks from this index on fail CopyOut and Verify
  // (counted as checksum failures, as the real client counts a reused slot). -1: none fail.
  int64_t fail_from_block = -1;
};

class FaultInjectingTierLink final : public TierLink {
 public:
  FaultInjectingTierLink(std::unique_ptr<TierLink> inner, TierFaultPolicy policy);

  void SetPolicy(TierFaultPolicy policy);
  TierLink& inner() { return *inner_; }

  void Offer(const BlockHash& hash, BlockFill fill) override;
  void Prepare(std::vector<BlockHash> chain, PrepareDone done,
               double recompute_seconds_per_block) override;
  void Release(const PromotedRun& run) override;
  // The inner link's statistics with the injected faults added.
  TierLinkStats Stats() const override;

 private:
  class Run;

  void CountChecksumFailure();

  const std::unique_ptr<TierLink> inner_;
  mutable absl::Mutex mu_;
  TierFaultPolicy policy_ ABSL_GUARDED_BY(mu_);
  uint64_t dropped_offers_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t failed_calls_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t failed_copies_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace pd::tier_client
