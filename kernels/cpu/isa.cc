#include "kernels/cpu/isa.h"

#include <algorithm>
#include <atomic>

namespace pd::kernels::cpu {
namespace {

Isa Detect() {
#if PD_CPU_X86
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq")) {
    return Isa::kAvx512;
  }
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
    return Isa::kAvx2;  // every AVX2 CPU has F16C
  }
#endif
  return Isa::kScalar;
}

std::atomic<Isa>& Active() {
  static std::atomic<Isa> active{DetectedIsa()};
  return active;
}

}  // namespace

Isa DetectedIsa() {
  static const Isa detected = Detect();
  return detected;
}

bool UseAvx512Vnni() {
#if PD_CPU_X86
  static const bool has_vnni = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512vnni") != 0;
  }();
  return has_vnni && ActiveIsa() == Isa::kAvx512;
#else
  return false;
#endif
}

Isa ActiveIsa() { return Active().load(std::memory_order_relaxed); }

void SetIsaForTest(Isa isa) {
  Active().store(std::min(isa, DetectedIsa()), std::memory_order_relaxed);
}

const char* IsaName(Isa isa) {
  switch (isa) {
    case Isa::kScalar:
      return "scalar";
    case Isa::kAvx2:
      return "avx2";
    case Isa::kAvx512:
      return "avx512";
  }
  return "?";
}

}  // namespace pd::kernels::cpu
