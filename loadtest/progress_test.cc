#include "loadtest/progress.h"

#include <cstdio>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pd::loadtest {
namespace {

using ::testing::HasSubstr;

TEST(ProgressTest, BarByRequests) {
  ProgressSnapshot s;
  s.completed = 45;
  s.failed = 5;
  s.in_flight = 3;
  s.elapsed_s = 2;
  s.output_tokens = 3000;
  s.total_requests = 100;
  const std::string bar = FormatProgressBar(s, 10);
  EXPECT_THAT(bar, HasSubstr("[#####.....]  50% 50/100"));
  EXPECT_THAT(bar, HasSubstr("3 in flight"));
  EXPECT_THAT(bar, HasSubstr("25.0 req/s"));
  EXPECT_THAT(bar, HasSubstr("1.50k tok/s"));
  EXPECT_THAT(bar, HasSubstr("5 failed"));
}

TEST(ProgressTest, BarByTimeAndWithoutBound) {
  ProgressSnapshot s;
  s.elapsed_s = 3;
  s.duration_s = 12;
  EXPECT_THAT(FormatProgressBar(s, 4), HasSubstr("[#...]  25% 0 |"));
  s.duration_s.reset();
  EXPECT_EQ(FormatProgressBar(s, 4).find('['), std::string::npos);
}

TEST(ProgressTest, PlainLine) {
  ProgressSnapshot s;
  s.completed = 10;
  s.elapsed_s = 5;
  s.total_requests = 20;
  EXPECT_EQ(FormatProgressLine(s),
            "progress: 5.0s 10/20 requests done (0 failed), 0 in flight, 2.0 req/s, 0 tok/s");
}

TEST(ProgressTest, ReporterDrawsAFinalLineOnStop) {
  std::FILE* f = std::tmpfile();
  ASSERT_NE(f, nullptr);
  {
    ProgressReporter r(f, ProgressMode::kBar, [] {
      ProgressSnapshot s;
      s.completed = 7;
      return s;
    });
    r.Stop();
  }
  std::rewind(f);
  char buf[512] = {};
  const size_t n = std::fread(buf, 1, sizeof(buf) - 1, f);
  std::fclose(f);
  const std::string out(buf, n);
  EXPECT_THAT(out, HasSubstr("7 |"));
  EXPECT_EQ(out.back(), '\n');
}

TEST(ProgressTest, ModeNames) {
  EXPECT_EQ(*ParseProgressMode("off"), ProgressMode::kOff);
  EXPECT_EQ(*ParseProgressMode("lines"), ProgressMode::kLines);
  EXPECT_FALSE(ParseProgressMode("fancy").ok());
}

}  // namespace
}  // namespace pd::loadtest
