#include <cctype>
#include <cstring>

#include "transport/conformance/conformance_suite.h"

namespace pd::transport::conformance {

std::string ParamName(const ::testing::TestParamInfo<ConformanceParam>& info) {
  std::string s;
  for (char c : info.param.name) {
    s.push_back(std::isalnum(static_cast<unsigned char>(c)) ? c : '_');
  }
  return s;
}

namespace {

uint64_t PatternWord(uint64_t seed, uint32_t block, uint64_t w) {
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + uint64_t{block} * 0xC2B2AE3D27D4EB4Full + w;
  x ^= x >> 29;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 32;
  return x;
}

}  // namespace

uint8_t PatternByte(uint64_t seed, uint32_t block, uint64_t i) {
  return static_cast<uint8_t>(PatternWord(seed, block, i / 8) >> (8 * (i % 8)));
}

void FillPattern(uint64_t seed, uint32_t block, char* dst, uint64_t block_bytes) {
  uint64_t i = 0;
  for (; i + 8 <= block_bytes; i += 8) {
    const uint64_t w = PatternWord(seed, block, i / 8);
    std::memcpy(dst + i, &w, 8);
  }
  for (; i < block_bytes; ++i) {
    dst[i] = static_cast<char>(PatternByte(seed, block, i));
  }
}

int64_t FirstPatternMismatch(uint64_t seed, uint32_t block, const char* data,
                             uint64_t block_bytes) {
  uint64_t i = 0;
  for (; i + 8 <= block_bytes; i += 8) {
    uint64_t got;
    std::memcpy(&got, data + i, 8);
    if (got != PatternWord(seed, block, i / 8)) {
      break;
    }
  }
  for (; i < block_bytes; ++i) {
    if (static_cast<uint8_t>(data[i]) != PatternByte(seed, block, i)) {
      return static_cast<int64_t>(i);
    }
  }
  return -1;
}

PoolGeometry TestGeometry(uint64_t block_bytes, uint64_t num_blocks) {
  PoolGeometry g;
  g.model_fingerprint = 0x5eed;
  g.dtype = "bf16";
  g.block_size = 16;
  g.num_layers = 2;
  g.num_kv_heads = 2;
  g.head_dim = 64;
  g.block_bytes = block_bytes;
  g.num_blocks = num_blocks;
  return g;
}

}  // namespace pd::transport::conformance
