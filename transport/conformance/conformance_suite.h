// The KvTransport conformance suite (NIXL-style): every backend instantiates
// KvTransportConformance with a factory for two connected in-process instances.
//
//   INSTANTIATE_TEST_SUITE_P(Tcp, KvTransportConformance,
//                            ::testing::Values(ConformanceParam{"tcp", &MakeTcpPair}));
//
// Test-only. The suite's TESTs live in conformance_suite.cc, which each backend's test target
// compiles in (a static library would let the linker drop them).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "gtest/gtest.h"
#include "transport/kv_transport.h"

namespace pd::transport::conformance {

struct ConformanceParam {
  std::string name;
  // Returns a fresh transport; all transports made by one test talk to each other (the
  // loopback factory shares one hub). `index` says which one a test is making: 0 the sender,
  // 1 the receiver, 2 a third transport; device-bound backends pick their device from it.
  std::function<absl::StatusOr<std::unique_ptr<KvTransport>>(int index)> make;
  // Where test pools live: host memory, or device memory (TestDeviceBuffer) on
  // `device_of(index)` for the transport made with that index.
  MemoryKind memory = MemoryKind::kHost;
  std::function<int(int index)> device_of;
  // When set and non-empty, every test of this param is skipped with the reason (a missing
  // GPU, or fewer GPUs than the backend needs).
  std::function<std::string()> skip_reason;
};

// gtest prints the name instead of the struct's bytes.
inline void PrintTo(const ConformanceParam& p, std::ostream* os) { *os << p.name; }

std::string ParamName(const ::testing::TestParamInfo<ConformanceParam>& info);

// Deterministic byte i of source block `block` for `seed` (also used by the peer binary).
uint8_t PatternByte(uint64_t seed, uint32_t block, uint64_t i);
void FillPattern(uint64_t seed, uint32_t block, char* dst, uint64_t block_bytes);
// Index of the first byte differing from the pattern, or -1.
int64_t FirstPatternMismatch(uint64_t seed, uint32_t block, const char* data, uint64_t block_bytes);

// A geometry for tests: block_bytes and num_blocks as given, other fields fixed.
PoolGeometry TestGeometry(uint64_t block_bytes, uint64_t num_blocks);

class KvTransportConformance : public ::testing::TestWithParam<ConformanceParam> {};

}  // namespace pd::transport::conformance
