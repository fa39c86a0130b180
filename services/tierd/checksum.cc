#include "services/tierd/checksum.h"

#include <array>

namespace pd::tierd {
namespace {

// Byte-wise table for the reflected Castagnoli polynomial. Manifest records are 56 bytes, so
// a table walk is plenty; no need for the SSE4.2 instruction.
constexpr std::array<uint32_t, 256> MakeCrc32cTable() {
  std::array<uint32_t, 256> table{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) {
      c = (c & 1) != 0 ? (c >> 1) ^ 0x82f63b78u : c >> 1;
    }
    table[i] = c;
  }
  return table;
}

constexpr std::array<uint32_t, 256> kCrc32cTable = MakeCrc32cTable();

}  // namespace

uint32_t Crc32c(absl::Span<const uint8_t> bytes) {
  uint32_t crc = 0xffffffffu;
  for (uint8_t b : bytes) {
    crc = kCrc32cTable[(crc ^ b) & 0xff] ^ (crc >> 8);
  }
  return crc ^ 0xffffffffu;
}

}  // namespace pd::tierd
