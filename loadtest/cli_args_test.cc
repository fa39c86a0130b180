#include "loadtest/cli_args.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pd::loadtest {
namespace {

using ::testing::ElementsAre;

TEST(CliArgsTest, ParsesLists) {
  EXPECT_THAT(*ParseDoubleList("request_rates", "1,2.5, 4"), ::testing::ElementsAre(1, 2.5, 4));
  EXPECT_THAT(*ParseIntList("workers", "8,16"), ::testing::ElementsAre(8, 16));
  EXPECT_THAT(*ParseNameList("policies", "a, b"), ::testing::ElementsAre("a", "b"));
  EXPECT_FALSE(ParseIntList("workers", "8,x").ok());
  EXPECT_FALSE(ParseIntList("workers", "8.5").ok());
  EXPECT_FALSE(ParseDoubleList("request_rates", "").ok());
  EXPECT_FALSE(ParseNameList("policies", "a,,b").ok());
}

}  // namespace
}  // namespace pd::loadtest
