// Run-time instruction-set selection for the CPU kernels. Private to kernels/.
//
// Kernels with vector code are compiled once per ISA (scalar, AVX2 + FMA + F16C, AVX-512
// F/BW/VL/DQ) inside PD_BEGIN_TARGET_* regions, in per-ISA namespaces, and pick one per call
// through ActiveIsa(). Nothing assumes the build machine's CPU: the binary runs anywhere x86-64
// (or elsewhere, scalar only).
#pragma once

#include <cstdint>

namespace pd::kernels::cpu {

enum class Isa : uint8_t { kScalar = 0, kAvx2 = 1, kAvx512 = 2 };

// The best ISA this CPU and OS support (__builtin_cpu_supports, detected once). Thread-safe.
Isa DetectedIsa();

// DetectedIsa() unless SetIsaForTest lowered it. Thread-safe.
Isa ActiveIsa();

// Makes kernels use `isa` (clamped to DetectedIsa()) so tests cover every compiled variant on
// one machine. Call only while no kernel runs.
void SetIsaForTest(Isa isa);

const char* IsaName(Isa isa);

// Whether the int8 MatMul may use AVX-512 VNNI (vpdpbusd): ActiveIsa() is kAvx512 and the CPU
// has avx512vnni. Without it the kAvx512 int8 path runs the AVX2 code. Thread-safe.
bool UseAvx512Vnni();

}  // namespace pd::kernels::cpu

#if defined(__x86_64__)
#define PD_CPU_X86 1
#else
#define PD_CPU_X86 0
#endif

// Target regions: every function defined between BEGIN and END is compiled for that ISA.
// clang-format off
#if PD_CPU_X86 && defined(__clang__)
#define PD_BEGIN_TARGET_AVX2 _Pragma("clang attribute push(__attribute__((target(\"avx2,fma,f16c\"))), apply_to = function)")
#define PD_BEGIN_TARGET_AVX512 _Pragma("clang attribute push(__attribute__((target(\"avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c\"))), apply_to = function)")
#define PD_BEGIN_TARGET_AVX512VNNI _Pragma("clang attribute push(__attribute__((target(\"avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c\"))), apply_to = function)")
#define PD_END_TARGET _Pragma("clang attribute pop")
#elif PD_CPU_X86
#define PD_BEGIN_TARGET_AVX2 _Pragma("GCC push_options") _Pragma("GCC target(\"avx2,fma,f16c\")")
#define PD_BEGIN_TARGET_AVX512 _Pragma("GCC push_options") _Pragma("GCC target(\"avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c\")")
#define PD_BEGIN_TARGET_AVX512VNNI _Pragma("GCC push_options") _Pragma("GCC target(\"avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c\")")
#define PD_END_TARGET _Pragma("GCC pop_options")
#endif
// clang-format on

// Calls ns::<call> for the active ISA's namespace ns (avx512, avx2 or scalar).
#if PD_CPU_X86
#define PD_ISA_DISPATCH(call)                  \
  do {                                         \
    switch (::pd::kernels::cpu::ActiveIsa()) { \
      case ::pd::kernels::cpu::Isa::kAvx512:   \
        ::pd::kernels::cpu::avx512::call;      \
        break;                                 \
      case ::pd::kernels::cpu::Isa::kAvx2:     \
        ::pd::kernels::cpu::avx2::call;        \
        break;                                 \
      case ::pd::kernels::cpu::Isa::kScalar:   \
        ::pd::kernels::cpu::scalar::call;      \
        break;                                 \
    }                                          \
  } while (false)
#else
#define PD_ISA_DISPATCH(call) ::pd::kernels::cpu::scalar::call
#endif
