#include "loadtest/cli_args.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pd::loadtest {
namespace {

using ::testing::ElementsAre;

TEST(CliArgsTest, RewritesDashedFlagNamesOnly) {
  EXPECT_THAT(UndashFlagNames({"pd-loadtest", "--slo-ttft-ms=50", "-on-bad-line", "skip",
                               "--workload=shared-prefix", "--output-json", "/tmp/a-b.json",
                               "--num_requests=3", "-", "--", "--not-a-flag"}),
              ElementsAre("pd-loadtest", "--slo_ttft_ms=50", "-on_bad_line", "skip",
                          "--workload=shared-prefix", "--output_json", "/tmp/a-b.json",
                          "--num_requests=3", "-", "--", "--not-a-flag"));
}

TEST(CliArgsTest, LeavesProgramNameAlone) {
  EXPECT_THAT(UndashFlagNames({"-odd-name"}), ElementsAre("-odd-name"));
  EXPECT_THAT(UndashFlagNames({}), ElementsAre());
}

}  // namespace
}  // namespace pd::loadtest
