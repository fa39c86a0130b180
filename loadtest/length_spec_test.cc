#include "loadtest/length_spec.h"

#include <random>

#include "gtest/gtest.h"

namespace pd::loadtest {
namespace {

TEST(LengthSpecTest, FixedForms) {
  for (const char* text : {"128", "fixed:128", " 128 "}) {
    absl::StatusOr<LengthSpec> s = LengthSpec::Parse(text);
    ASSERT_TRUE(s.ok()) << text << ": " << s.status();
    std::mt19937_64 rng(1);
    EXPECT_EQ(s->Sample(rng), 128);
    EXPECT_EQ(s->max(), 128);
    EXPECT_EQ(s->ToString(), "128");
  }
}

TEST(LengthSpecTest, UniformStaysInBoundsAndCoversThem) {
  absl::StatusOr<LengthSpec> s = LengthSpec::Parse("uniform:3,6");
  ASSERT_TRUE(s.ok()) << s.status();
  std::mt19937_64 rng(7);
  bool seen[7] = {};
  for (int i = 0; i < 1000; ++i) {
    const int64_t v = s->Sample(rng);
    ASSERT_GE(v, 3);
    ASSERT_LE(v, 6);
    seen[v] = true;
  }
  EXPECT_TRUE(seen[3] && seen[4] && seen[5] && seen[6]);
  EXPECT_EQ(s->ToString(), "uniform:3,6");
}

TEST(LengthSpecTest, NormalIsClampedToDefaultAndGivenBounds) {
  absl::StatusOr<LengthSpec> s = LengthSpec::Parse("normal:10,100");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->max(), 20);
  std::mt19937_64 rng(3);
  for (int i = 0; i < 1000; ++i) {
    const int64_t v = s->Sample(rng);
    ASSERT_GE(v, 1);
    ASSERT_LE(v, 20);
  }
  absl::StatusOr<LengthSpec> b = LengthSpec::Parse("normal:100,50,90,110");
  ASSERT_TRUE(b.ok()) << b.status();
  for (int i = 0; i < 1000; ++i) {
    const int64_t v = b->Sample(rng);
    ASSERT_GE(v, 90);
    ASSERT_LE(v, 110);
  }
  absl::StatusOr<LengthSpec> zero_sd = LengthSpec::Parse("normal:42,0");
  ASSERT_TRUE(zero_sd.ok());
  EXPECT_EQ(zero_sd->Sample(rng), 42);
}

TEST(LengthSpecTest, SameSeedSameSequence) {
  absl::StatusOr<LengthSpec> s = LengthSpec::Parse("normal:512,128");
  ASSERT_TRUE(s.ok());
  std::mt19937_64 a(5), b(5);
  for (int i = 0; i < 100; ++i) {
    EXPECT_EQ(s->Sample(a), s->Sample(b));
  }
}

TEST(LengthSpecTest, RejectsMalformedSpecs) {
  for (const char* text : {"", "0", "-3", "1.5", "abc", "fixed:", "uniform:5", "uniform:6,5",
                           "uniform:0,5", "normal:10", "normal:10,-1", "normal:0,1",
                           "normal:10,1,5", "normal:10,1,8,4", "poisson:3", "uniform:1,2,3"}) {
    absl::StatusOr<LengthSpec> s = LengthSpec::Parse(text);
    EXPECT_FALSE(s.ok()) << "'" << text << "' parsed";
    if (!s.ok()) {
      EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
      EXPECT_NE(s.status().message().find("expected N, fixed:N"), absl::string_view::npos);
    }
  }
}

}  // namespace
}  // namespace pd::loadtest
