#include "services/tier_client/testing/fault_injecting_tier_link.h"

#include <cstring>
#include <memory>
#include <vector>

#include "gtest/gtest.h"
#include "services/tier_client/testing/fake_tier_link.h"

namespace pd::tier_client {
namespace {

constexpr int64_t kBlockBytes = 64;

BlockHash H(uint64_t i) { return BlockHash{i, ~i}; }

class FaultInjectingTierLinkTest : public ::testing::Test {
 protected:
  FaultInjectingTierLinkTest() {
    auto fake = std::make_unique<FakeTierLink>(kBlockBytes);
    fake_ = fake.get();
    link_ = std::make_unique<FaultInjectingTierLink>(std::move(fake), TierFaultPolicy{});
  }

  // Offers block `i`; returns whether `fill` was called.
  bool OfferBlock(uint64_t i) {
    bool filled = false;
    link_->Offer(H(i), [&](uint8_t* dst) {
      std::memset(dst, static_cast<int>(i + 1), kBlockBytes);
      filled = true;
      return true;
    });
    return filled;
  }

  std::shared_ptr<const PromotedRun> PrepareNow(std::vector<BlockHash> chain) {
    std::shared_ptr<const PromotedRun> got;
    link_->Prepare(
        std::move(chain), [&](std::shared_ptr<const PromotedRun> run) { got = std::move(run); }, 0);
    return got;
  }

  FakeTierLink* fake_ = nullptr;
  std::unique_ptr<FaultInjectingTierLink> link_;
};

TEST_F(FaultInjectingTierLinkTest, NoFaultsForwardsEverything) {
  EXPECT_TRUE(OfferBlock(0));
  EXPECT_TRUE(fake_->Holds(H(0)));
  std::shared_ptr<const PromotedRun> run = PrepareNow({H(0)});
  ASSERT_NE(run, nullptr);
  EXPECT_TRUE(run->Verify(0));
  link_->Release(*run);  // unwrapped: the fake sees its own run released
  EXPECT_EQ(fake_->UnreleasedRunsForTest(), 0);
  EXPECT_TRUE(link_->Stats().attached);
}

TEST_F(FaultInjectingTierLinkTest, RefusedOffersAreDroppedAndCounted) {
  link_->SetPolicy({.refuse_offers = true});
  EXPECT_FALSE(OfferBlock(0));
  EXPECT_FALSE(fake_->Holds(H(0)));
  EXPECT_EQ(link_->Stats().offer_dropped_blocks_total, 1u);
  EXPECT_TRUE(link_->Stats().attached);
}

TEST_F(FaultInjectingTierLinkTest, GoneTierdAnswersNothingAndDropsOffers) {
  EXPECT_TRUE(OfferBlock(0));
  link_->SetPolicy({.tierd_gone = true});
  EXPECT_EQ(PrepareNow({H(0)}), nullptr);
  EXPECT_FALSE(OfferBlock(1));
  const TierLinkStats st = link_->Stats();
  EXPECT_FALSE(st.attached);
  EXPECT_EQ(st.rpc_failures_total, 1u);
  EXPECT_EQ(st.offer_dropped_blocks_total, 1u);
  EXPECT_EQ(fake_->UnreleasedRunsForTest(), 0);
}

TEST_F(FaultInjectingTierLinkTest, RunFailsFromTheGivenBlockOn) {
  for (uint64_t i = 0; i < 4; ++i) {
    OfferBlock(i);
  }
  link_->SetPolicy({.fail_from_block = 2});
  std::shared_ptr<const PromotedRun> run = PrepareNow({H(0), H(1), H(2), H(3)});
  ASSERT_NE(run, nullptr);
  ASSERT_EQ(run->size(), 4u);
  std::vector<uint8_t> copy(kBlockBytes);
  EXPECT_TRUE(run->CopyOut(1, copy.data()));
  EXPECT_TRUE(run->Verify(1));
  EXPECT_FALSE(run->CopyOut(2, copy.data()));
  EXPECT_FALSE(run->Verify(3));
  EXPECT_EQ(link_->Stats().checksum_failures_total, 2u);
  // The failure point is the run's: a later policy does not change it.
  link_->SetPolicy({});
  EXPECT_FALSE(run->Verify(2));
  link_->Release(*run);
  EXPECT_EQ(fake_->UnreleasedRunsForTest(), 0);
}

}  // namespace
}  // namespace pd::tier_client
