#include "common/base/dashed_flags.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pd {
namespace {

using ::testing::ElementsAre;

TEST(UndashFlagTest, RewritesOnlyTheNameOfFlags) {
  EXPECT_EQ(UndashFlag("--max-tokens=5"), "--max_tokens=5");
  EXPECT_EQ(UndashFlag("--max-tokens"), "--max_tokens");
  EXPECT_EQ(UndashFlag("-top-k=3"), "-top_k=3");
  EXPECT_EQ(UndashFlag("--stop=a-b-c"), "--stop=a-b-c");
  EXPECT_EQ(UndashFlag("--cache-salt=--x"), "--cache_salt=--x");
  EXPECT_EQ(UndashFlag("--already_underscored=1"), "--already_underscored=1");
  EXPECT_EQ(UndashFlag("Once-upon"), "Once-upon");
  EXPECT_EQ(UndashFlag("-"), "-");
  EXPECT_EQ(UndashFlag("--"), "--");
  EXPECT_EQ(UndashFlag(""), "");
}

TEST(UndashFlagNamesTest, RewritesDashedFlagNamesOnly) {
  EXPECT_THAT(UndashFlagNames({"pd-loadtest", "--slo-ttft-ms=50", "-on-bad-line", "skip",
                               "--workload=shared-prefix", "--output-json", "/tmp/a-b.json",
                               "--num_requests=3", "-", "--", "--not-a-flag"}),
              ElementsAre("pd-loadtest", "--slo_ttft_ms=50", "-on_bad_line", "skip",
                          "--workload=shared-prefix", "--output_json", "/tmp/a-b.json",
                          "--num_requests=3", "-", "--", "--not-a-flag"));
}

TEST(UndashFlagNamesTest, LeavesProgramNameAlone) {
  EXPECT_THAT(UndashFlagNames({"-odd-name"}), ElementsAre("-odd-name"));
  EXPECT_THAT(UndashFlagNames({}), ElementsAre());
}

TEST(UndashedArgvTest, IsAnArgvOfTheUndashedArguments) {
  std::string a0 = "pd-routesim", a1 = "--trace-file=x-y.jsonl", a2 = "--", a3 = "--keep-me";
  char* argv[] = {a0.data(), a1.data(), a2.data(), a3.data()};
  UndashedArgv undashed(4, argv);
  ASSERT_EQ(undashed.argc(), 4);
  EXPECT_STREQ(undashed.argv()[0], "pd-routesim");
  EXPECT_STREQ(undashed.argv()[1], "--trace_file=x-y.jsonl");
  EXPECT_STREQ(undashed.argv()[2], "--");
  EXPECT_STREQ(undashed.argv()[3], "--keep-me");
  EXPECT_EQ(undashed.argv()[4], nullptr);
  EXPECT_EQ(a1, "--trace-file=x-y.jsonl");  // the caller's argv is left alone
}

}  // namespace
}  // namespace pd
