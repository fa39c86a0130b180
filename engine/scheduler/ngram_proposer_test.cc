#include "engine/scheduler/ngram_proposer.h"

#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pd::engine {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

TEST(NgramProposerTest, ProposesWhatFollowedTheLatestEarlierOccurrence) {
  // ... 1 2 3 [7 8 9] ... 1 2 3 [4 5] ... 1 2 3: the latest earlier "1 2 3" is followed by 4 5.
  const std::vector<uint32_t> t = {1, 2, 3, 7, 8, 9, 1, 2, 3, 4, 5, 6, 1, 2, 3};
  EXPECT_THAT(ProposeNgram(t, 2), ElementsAre(4, 5));
  EXPECT_THAT(ProposeNgram(t, 6), ElementsAre(4, 5, 6, 1, 2, 3));  // up to the end
  // No later occurrence has 10 after it: the one with the most.
  EXPECT_THAT(ProposeNgram(t, 10), ElementsAre(7, 8, 9, 1, 2, 3, 4, 5, 6, 1));
  EXPECT_THAT(ProposeNgram(t, 0), IsEmpty());
}

TEST(NgramProposerTest, LongerSuffixesWinThenShorterOnesAreTried) {
  // "5 6" recurs once (followed by 9); "6" alone recurs later (followed by 7).
  const std::vector<uint32_t> t = {5, 6, 9, 1, 6, 7, 2, 5, 6};
  EXPECT_THAT(ProposeNgram(t, 1), ElementsAre(9));
  EXPECT_THAT(ProposeNgram(t, 1, {.max_n = 1, .min_n = 1}), ElementsAre(7));
  // Nothing recurs: nothing proposed; a minimum n above every match: nothing either.
  EXPECT_THAT(ProposeNgram(std::vector<uint32_t>{1, 2, 3, 4}, 3), IsEmpty());
  EXPECT_THAT(ProposeNgram(t, 1, {.max_n = 3, .min_n = 3}), IsEmpty());
}

TEST(NgramProposerTest, ShortAndRepeatingInputs) {
  EXPECT_THAT(ProposeNgram(std::vector<uint32_t>{}, 4), IsEmpty());
  EXPECT_THAT(ProposeNgram(std::vector<uint32_t>{7}, 4), IsEmpty());
  // A run of one token proposes more of it.
  EXPECT_THAT(ProposeNgram(std::vector<uint32_t>{7, 7, 7, 7}, 2), ElementsAre(7));
  EXPECT_THAT(ProposeNgram(std::vector<uint32_t>{7, 7, 7, 7, 7, 7}, 2), ElementsAre(7, 7));
}

}  // namespace
}  // namespace pd::engine
