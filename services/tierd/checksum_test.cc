#include "services/tierd/checksum.h"

#include <string>

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

}  // namespace
}  // namespace pd::tierd
