#include "services/tierd/admission_guard.h"

#include <cstdint>

#include "gtest/gtest.h"

namespace pd::tierd {
namespace {

BlockHash H(uint64_t i) {
  // Spread like real XXH3 block hashes.
  return BlockHash{i * 0x9e3779b97f4a7c15ull + 1, (i + 7) * 0xc2b2ae3d27d4eb4full};
}

TEST(AdmissionGuardTest, AdmitsOnlyBlocksSeenTwice) {
  AdmissionGuard guard({.expected_blocks = 1024, .min_count = 2});
  EXPECT_FALSE(guard.Admit(H(1)));  // never seen
  guard.Record(H(1));
  EXPECT_EQ(guard.Estimate(H(1)), 1);
  EXPECT_FALSE(guard.Admit(H(1)));
  guard.Record(H(1));
  EXPECT_TRUE(guard.Admit(H(1)));
  const AdmissionGuardStats stats = guard.Stats();
  EXPECT_EQ(stats.records_total, 2u);
  EXPECT_EQ(stats.admitted_total, 1u);
  EXPECT_EQ(stats.rejected_total, 2u);
}

TEST(AdmissionGuardTest, MinCountOneAdmitsEverySeenBlock) {
  AdmissionGuard guard({.expected_blocks = 64, .min_count = 1});
  guard.Record(H(5));
  EXPECT_TRUE(guard.Admit(H(5)));
}

TEST(AdmissionGuardTest, CountsSaturate) {
  AdmissionGuard guard({.expected_blocks = 64, .min_count = 2});
  for (int i = 0; i < 100; ++i) {
    guard.Record(H(3));
  }
  EXPECT_LE(guard.Estimate(H(3)), 15);
  EXPECT_GE(guard.Estimate(H(3)), 2);
}

// With as many one-time blocks as the sketch is sized for, few are wrongly admitted: the
// sketch is bounded yet precise enough to keep one-hit blocks off the disk.
TEST(AdmissionGuardTest, FewFalseAdmissionsAtDesignLoad) {
  constexpr int kBlocks = 4096;
  AdmissionGuard guard({.expected_blocks = kBlocks, .min_count = 2});
  for (int i = 0; i < kBlocks; ++i) {
    guard.Record(H(i));
  }
  int false_admits = 0;
  for (int i = 0; i < kBlocks; ++i) {
    false_admits += guard.Admit(H(i)) ? 1 : 0;
  }
  EXPECT_LT(false_admits, kBlocks / 50) << "more than 2% of one-hit blocks admitted";
}

// Old popularity fades: after a full sample of other records, a block seen twice long ago
// counts at most once.
TEST(AdmissionGuardTest, AgingHalvesOldCounts) {
  AdmissionGuard guard({.expected_blocks = 64, .min_count = 2});  // 256 counters a row
  guard.Record(H(1));
  guard.Record(H(1));
  ASSERT_TRUE(guard.Admit(H(1)));
  for (int i = 0; i < 2 * 256; ++i) {  // a sample is 2 * width records
    guard.Record(H(2));
  }
  EXPECT_EQ(guard.Stats().resets_total, 1u);
  EXPECT_EQ(guard.Estimate(H(1)), 1);
  EXPECT_FALSE(guard.Admit(H(1)));
}

TEST(AdmissionGuardTest, ConfigValidation) {
  EXPECT_TRUE(AdmissionGuardConfig{}.Validate().ok());
  EXPECT_FALSE((AdmissionGuardConfig{.expected_blocks = 0}).Validate().ok());
  EXPECT_FALSE((AdmissionGuardConfig{.min_count = 16}).Validate().ok());
  EXPECT_FALSE((AdmissionGuardConfig{.min_count = 0}).Validate().ok());
}

}  // namespace
}  // namespace pd::tierd
