#include "engine/scheduler/compress_policy.h"

#include <cstdint>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pd::engine {
namespace {

using ::testing::ElementsAre;

TEST(CompressPolicyTest, SettingsAreValidatedAndTheBudgetIsWholeBlocks) {
  EXPECT_TRUE(CompressPolicy::Validate("", 0, 0).ok());
  EXPECT_TRUE(absl::IsInvalidArgument(CompressPolicy::Validate("", 64, 0)));
  EXPECT_TRUE(absl::IsInvalidArgument(CompressPolicy::Validate("h2", 64, 8)));
  EXPECT_TRUE(absl::IsInvalidArgument(CompressPolicy::Validate("h2o", 64, 64)));
  EXPECT_TRUE(absl::IsInvalidArgument(CompressPolicy::Validate("snapkv", 64, 0)));
  EXPECT_TRUE(absl::IsInvalidArgument(CompressPolicy::Create("h2o", 500, 8, 16, 512).status()));
  absl::StatusOr<CompressPolicy> p = CompressPolicy::Create("h2o", 50, 8, 16, 512);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->budget(), 64);
  EXPECT_EQ(p->CacheCapTokens(10, false), 80);
  EXPECT_EQ(p->ScoreSlots(10), 80);
  EXPECT_EQ(p->ScoreFrom(10, 0), 0);
  EXPECT_EQ(p->MaxBlocks(100), 5 + 4);  // its cap, and the fresh blocks of a compaction
  EXPECT_EQ(p->MaxBlocks(2), 2 + 4);
  absl::StatusOr<CompressPolicy> s = CompressPolicy::Create("snapkv", 32, 8, 16, 512);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->CacheCapTokens(100, false), 100);
  EXPECT_GT(s->CacheCapTokens(100, true), int64_t{1} << 60);
  EXPECT_EQ(s->ScoreSlots(100), 100);
  EXPECT_EQ(s->ScoreFrom(100, 0), 92);  // the last 8 prompt tokens score
  EXPECT_EQ(s->ScoreFrom(100, 95), 0);
  EXPECT_EQ(s->ScoreFrom(100, 100), 0);  // (generated tokens: the row is past the prompt)
}

// H2O: the recent tokens, then the heaviest older ones (ties: the earlier), ascending, each
// row on its own.
TEST(CompressPolicyTest, H2oKeepsTheRecentWindowAndTheHeaviestHitters) {
  absl::StatusOr<CompressPolicy> p = CompressPolicy::Create("h2o", 4, 2, 4, 64);
  ASSERT_TRUE(p.ok());
  // 2 rows, 8 slots held of stride 9; keep 4: 2 recent (6, 7) + the 2 heaviest of 0..5.
  const std::vector<float> scores = {
      0.5f, 3.0f, 0.1f, 3.0f, 2.0f, 0.0f, 9.0f, 9.0f, 0.0f,  // row 0: 1 and 3 tie at the top
      7.0f, 0.0f, 0.0f, 0.0f, 0.0f, 6.0f, 0.0f, 0.0f, 0.0f,  // row 1: 0 and 5
  };
  std::vector<int32_t> keep;
  p->Select(scores.data(), 9, 8, 2, &keep);
  EXPECT_THAT(keep, ElementsAre(1, 3, 6, 7, 0, 5, 6, 7));
  // Ties broken by the earlier slot; a NaN score loses.
  const std::vector<float> ties = {1.0f, 1.0f, NAN, 1.0f, 0.0f, 0.0f, 0.0f, 0.0f};
  p->Select(ties.data(), 8, 8, 1, &keep);
  EXPECT_THAT(keep, ElementsAre(0, 1, 6, 7));
  // Fewer held than the budget: everything is kept.
  p->Select(ties.data(), 8, 3, 1, &keep);
  EXPECT_THAT(keep, ElementsAre(0, 1, 2));
}

// SnapKV: the observation window, then the best max-pooled scores of the earlier positions
// (the pool spreads a peak over its neighbours, so they come along).
TEST(CompressPolicyTest, SnapKvKeepsTheWindowAndThePooledBest) {
  absl::StatusOr<CompressPolicy> p = CompressPolicy::Create("snapkv", 4, 1, 4, 64);
  ASSERT_TRUE(p.ok());
  std::vector<float> scores(20, 0.0f);
  scores[10] = 5.0f;  // pools over 7..13 (all candidates are < 19)
  scores[2] = 1.0f;
  std::vector<int32_t> keep;
  p->Select(scores.data(), 20, 20, 1, &keep);
  EXPECT_THAT(keep, ElementsAre(7, 8, 9, 19));  // three of the pooled peak, then the window
}

}  // namespace
}  // namespace pd::engine
