#include "services/tier_client/testing/fake_tier_link.h"

#include <cstring>
#include <memory>
#include <vector>

#include "gtest/gtest.h"

namespace pd::tier_client {
namespace {

constexpr int64_t kBlockBytes = 64;

BlockHash H(uint64_t i) { return BlockHash{i, ~i}; }

// Offers block `i` filled with i + 1.
void OfferBlock(TierLink& link, uint64_t i) {
  link.Offer(H(i), [i](uint8_t* dst) {
    std::memset(dst, static_cast<int>(i + 1), kBlockBytes);
    return true;
  });
}

std::shared_ptr<const PromotedRun> PrepareNow(TierLink& link, std::vector<BlockHash> chain) {
  std::shared_ptr<const PromotedRun> got;
  bool answered = false;
  link.Prepare(
      std::move(chain),
      [&](std::shared_ptr<const PromotedRun> run) {
        got = std::move(run);
        answered = true;
      },
      0);
  EXPECT_TRUE(answered) << "the fake answers on the calling thread";
  return got;
}

TEST(FakeTierLinkTest, OfferedBlocksComeBackAsTheChainsLeadingRun) {
  FakeTierLink link(kBlockBytes);
  OfferBlock(link, 0);
  OfferBlock(link, 1);
  OfferBlock(link, 3);
  OfferBlock(link, 1);                               // already held
  link.Offer(H(9), [](uint8_t*) { return false; });  // unreadable: nothing
  std::shared_ptr<const PromotedRun> run = PrepareNow(link, {H(0), H(1), H(2), H(3)});
  ASSERT_NE(run, nullptr);
  ASSERT_EQ(run->size(), 2u);  // stops at the first block it lacks
  EXPECT_EQ(run->block_bytes(), kBlockBytes);
  std::vector<uint8_t> copy(kBlockBytes);
  ASSERT_TRUE(run->CopyOut(1, copy.data()));
  EXPECT_EQ(copy, std::vector<uint8_t>(kBlockBytes, 2));
  EXPECT_TRUE(run->Verify(0));
  EXPECT_EQ(link.UnreleasedRunsForTest(), 1);
  link.Release(*run);
  EXPECT_EQ(link.UnreleasedRunsForTest(), 0);
  EXPECT_EQ(PrepareNow(link, {H(2)}), nullptr);
  EXPECT_FALSE(link.Holds(H(9)));
  const TierLinkStats st = link.Stats();
  EXPECT_EQ(st.offered_blocks_total, 4u);
  EXPECT_EQ(st.offer_stored_blocks_total, 3u);
  EXPECT_EQ(st.offer_skipped_blocks_total, 1u);
  EXPECT_EQ(st.prepares_total, 2u);
  EXPECT_EQ(st.promoted_blocks_total, 2u);
}

// A stored block changed behind its checksum fails verification, also in a run already held.
TEST(FakeTierLinkTest, CorruptedBlockFailsVerification) {
  FakeTierLink link(kBlockBytes);
  OfferBlock(link, 0);
  OfferBlock(link, 1);
  std::shared_ptr<const PromotedRun> run = PrepareNow(link, {H(0), H(1)});
  ASSERT_NE(run, nullptr);
  ASSERT_TRUE(link.CorruptForTest(H(1)));
  EXPECT_FALSE(link.CorruptForTest(H(7)));
  EXPECT_TRUE(run->Verify(0));
  EXPECT_FALSE(run->Verify(1));
  std::vector<uint8_t> copy(kBlockBytes);
  EXPECT_FALSE(run->CopyOut(1, copy.data()));
  EXPECT_EQ(link.Stats().checksum_failures_total, 2u);
  link.Release(*run);
}

}  // namespace
}  // namespace pd::tier_client
