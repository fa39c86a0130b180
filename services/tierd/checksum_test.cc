#include "services/tierd/checksum.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace pd::tierd {
namespace {

absl::Span<const uint8_t> Bytes(const std::string& s) {
  return absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(s.data()), s.size());
}

TEST(ChecksumTest, Crc32cKnownVectors) {
  EXPECT_EQ(Crc32c(Bytes("123456789")), 0xe3069283u);  // the standard check value
  EXPECT_EQ(Crc32c(Bytes("")), 0u);
  EXPECT_EQ(Crc32c(Bytes(std::string(32, '\0'))), 0x8a9136aau);  // RFC 3720 B.4
}

TEST(ChecksumTest, BlockChecksumIsXxh3SeedZero) {
  EXPECT_EQ(BlockChecksum(Bytes("")), 0x2d06800538d394c2ull);  // XXH3_64bits of no bytes
  std::vector<uint8_t> block(4096, 7);
  const uint64_t before = BlockChecksum(block);
  block[4095] ^= 1;
  EXPECT_NE(BlockChecksum(block), before);
}

}  // namespace
}  // namespace pd::tierd
