#include "services/tier_client/testing/fake_tier_link.h"

#include <cstring>
#include <utility>

#include "common/log/log.h"
#include "services/tier_shm/block_checksum.h"

namespace pd::tier_client {

// The blocks of one Prepare, sharing the held bytes (as a pinned slot shares tierd's memory).
class FakeTierLink::Run final : public PromotedRun {
 public:
  Run(FakeTierLink* link, std::vector<Block> blocks) : link_(link), blocks_(std::move(blocks)) {}

  size_t size() const override { return blocks_.size(); }
  int64_t block_bytes() const override { return link_->block_bytes_; }
  tier_shm::TierKind source(size_t) const override { return tier_shm::TierKind::kDram; }
  bool CopyOut(size_t k, uint8_t* dst) const override {
    std::memcpy(dst, BlockBytes(k), static_cast<size_t>(block_bytes()));
    return Check(k, dst);
  }
  const uint8_t* BlockBytes(size_t k) const override { return blocks_[k].bytes->data(); }
  bool Verify(size_t k) const override { return Check(k, BlockBytes(k)); }

 private:
  bool Check(size_t k, const uint8_t* bytes) const {
    if (tier_shm::BlockChecksum(absl::MakeConstSpan(bytes, static_cast<size_t>(block_bytes()))) !=
        blocks_[k].checksum) {
      link_->CountChecksumFailure();
      return false;
    }
    return true;
  }

  FakeTierLink* const link_;
  const std::vector<Block> blocks_;
};

FakeTierLink::FakeTierLink(int64_t block_bytes) : block_bytes_(block_bytes) {
  CHECK_GT(block_bytes, 0);
  stats_.attached = true;
  stats_.attaches_total = 1;
}

void FakeTierLink::Offer(const BlockHash& hash, BlockFill fill) {
  auto bytes = std::make_shared<std::vector<uint8_t>>(static_cast<size_t>(block_bytes_));
  if (!fill(bytes->data())) {
    return;
  }
  const uint64_t checksum = tier_shm::BlockChecksum(*bytes);
  absl::MutexLock lock(&mu_);
  ++stats_.offered_blocks_total;
  if (!blocks_.emplace(hash, Block{std::move(bytes), checksum}).second) {
    ++stats_.offer_skipped_blocks_total;
    return;
  }
  ++stats_.offer_stored_blocks_total;
}

void FakeTierLink::Prepare(std::vector<BlockHash> chain, PrepareDone done, double) {
  std::vector<Block> run;
  {
    absl::MutexLock lock(&mu_);
    ++stats_.prepares_total;
    for (const BlockHash& h : chain) {
      auto it = blocks_.find(h);
      if (it == blocks_.end()) {
        break;
      }
      run.push_back(it->second);
    }
    stats_.promoted_blocks_total += run.size();
    if (!run.empty()) {
      ++unreleased_runs_;
    }
  }
  if (run.empty()) {
    done(nullptr);
    return;
  }
  done(std::make_shared<Run>(this, std::move(run)));
}

void FakeTierLink::Release(const PromotedRun&) {
  absl::MutexLock lock(&mu_);
  CHECK_GT(unreleased_runs_, 0) << "a run released twice, or one this link never made";
  --unreleased_runs_;
}

TierLinkStats FakeTierLink::Stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

bool FakeTierLink::Holds(const BlockHash& hash) const {
  absl::MutexLock lock(&mu_);
  return blocks_.contains(hash);
}

bool FakeTierLink::CorruptForTest(const BlockHash& hash) {
  absl::MutexLock lock(&mu_);
  auto it = blocks_.find(hash);
  if (it == blocks_.end()) {
    return false;
  }
  // The top byte of every 4-byte word (an f32's sign and exponent): used as KV, such a block
  // changes what the model computes, not just its checksum.
  std::vector<uint8_t>& bytes = *it->second.bytes;
  for (size_t i = 3; i < bytes.size(); i += 4) {
    bytes[i] ^= 0x40;
  }
  return true;
}

int64_t FakeTierLink::UnreleasedRunsForTest() const {
  absl::MutexLock lock(&mu_);
  return unreleased_runs_;
}

void FakeTierLink::CountChecksumFailure() {
  absl::MutexLock lock(&mu_);
  ++stats_.checksum_failures_total;
}

}  // namespace pd::tier_client
