#include "services/tier_shm/block_checksum.h"

#include <vector>

#include "gtest/gtest.h"

namespace pd::tier_shm {
namespace {

TEST(BlockChecksumTest, IsXxh3SeedZero) {
  EXPECT_EQ(BlockChecksum({}), 0x2d06800538d394c2ull);  // XXH3_64bits of no bytes
  std::vector<uint8_t> block(4096, 7);
  const uint64_t before = BlockChecksum(block);
  block[4095] ^= 1;
  EXPECT_NE(BlockChecksum(block), before);
}

}  // namespace
}  // namespace pd::tier_shm
