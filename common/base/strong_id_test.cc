#include "common/base/strong_id.h"

#include <type_traits>

#include "absl/container/flat_hash_set.h"
#include "gtest/gtest.h"

namespace pd {
namespace {

TEST(StrongIdTest, DefaultIsInvalidAndValuesCompare) {
  EXPECT_FALSE(BlockId().valid());
  EXPECT_EQ(BlockId(), BlockId::Invalid());
  BlockId a(3), b(5);
  EXPECT_TRUE(a.valid());
  EXPECT_LT(a, b);
  EXPECT_EQ(a.value(), 3u);
  EXPECT_EQ(b.ToString(), "5");
}

TEST(StrongIdTest, DistinctTagsDoNotConvert) {
  static_assert(!std::is_convertible_v<BlockId, WorkerId>);
  static_assert(!std::is_convertible_v<uint32_t, BlockId>);
  static_assert(sizeof(BlockId) == sizeof(uint32_t));
}

TEST(StrongIdTest, Hashable) {
  absl::flat_hash_set<RequestId> ids = {RequestId(1), RequestId(2), RequestId(1)};
  EXPECT_EQ(ids.size(), 2u);
}

}  // namespace
}  // namespace pd
