#include "services/tier_client/testing/fault_injecting_tier_link.h"

#include <utility>

namespace pd::tier_client {

// The inner link's run, failing from a block on.
class FaultInjectingTierLink::Run final : public PromotedRun {
 public:
  Run(FaultInjectingTierLink* link, std::shared_ptr<const PromotedRun> inner,
      int64_t fail_from_block)
      : link_(link), inner_(std::move(inner)), fail_from_block_(fail_from_block) {}

  const PromotedRun& inner() const { return *inner_; }

  size_t size() const override { return inner_->size(); }
  int64_t block_bytes() const override { return inner_->block_bytes(); }
  tier_shm::TierKind source(size_t k) const override { return inner_->source(k); }
  bool CopyOut(size_t k, uint8_t* dst) const override {
    return !Fails(k) && inner_->CopyOut(k, dst);
  }
  const uint8_t* BlockBytes(size_t k) const override { return inner_->BlockBytes(k); }
  bool Verify(size_t k) const override { return !Fails(k) && inner_->Verify(k); }

 private:
  bool Fails(size_t k) const {
    if (fail_from_block_ >= 0 && static_cast<int64_t>(k) >= fail_from_block_) {
      link_->CountChecksumFailure();
      return true;
    }
    return false;
  }

  FaultInjectingTierLink* const link_;
  const std::shared_ptr<const PromotedRun> inner_;
  const int64_t fail_from_block_;
};

FaultInjectingTierLink::FaultInjectingTierLink(std::unique_ptr<TierLink> inner,
                                               TierFaultPolicy policy)
    : inner_(std::move(inner)), policy_(policy) {}

void FaultInjectingTierLink::SetPolicy(TierFaultPolicy policy) {
  absl::MutexLock lock(&mu_);
  policy_ = policy;
}

void FaultInjectingTierLink::Offer(const BlockHash& hash, BlockFill fill) {
  {
    absl::MutexLock lock(&mu_);
    if (policy_.refuse_offers || policy_.tierd_gone) {
      ++dropped_offers_;
      return;
    }
  }
  inner_->Offer(hash, fill);
}

void FaultInjectingTierLink::Prepare(std::vector<BlockHash> chain, PrepareDone done,
                                     double recompute_seconds_per_block) {
  int64_t fail_from_block = -1;
  bool gone = false;
  {
    absl::MutexLock lock(&mu_);
    gone = policy_.tierd_gone;
    failed_calls_ += gone ? 1 : 0;
    fail_from_block = policy_.fail_from_block;
  }
  if (gone) {
    done(nullptr);  // outside the lock: `done` may read Stats()
    return;
  }
  inner_->Prepare(
      std::move(chain),
      [this, fail_from_block,
       done = std::move(done)](std::shared_ptr<const PromotedRun> run) mutable {
        if (run == nullptr) {
          done(nullptr);
          return;
        }
        done(std::make_shared<Run>(this, std::move(run), fail_from_block));
      },
      recompute_seconds_per_block);
}

void FaultInjectingTierLink::Release(const PromotedRun& run) {
  // Every run this decorator hands out is its own Run (the TierLink contract).
  inner_->Release(static_cast<const Run&>(run).inner());
}

TierLinkStats FaultInjectingTierLink::Stats() const {
  TierLinkStats st = inner_->Stats();
  absl::MutexLock lock(&mu_);
  st.offer_dropped_blocks_total += dropped_offers_;
  st.rpc_failures_total += failed_calls_;
  st.checksum_failures_total += failed_copies_;
  if (policy_.tierd_gone) {
    st.attached = false;
  }
  return st;
}

void FaultInjectingTierLink::CountChecksumFailure() {
  absl::MutexLock lock(&mu_);
  ++failed_copies_;
}

}  // namespace pd::tier_client
