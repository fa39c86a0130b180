// Row-level vector routines shared by the CPU kernels, one compiled copy per ISA
// (kernels/cpu/vector_ops.inc). Call the per-ISA namespace that matches the caller's own
// region, or use PD_ISA_DISPATCH from scalar code. Private to kernels/cpu.
#pragma once

#include <cstdint>

#include "kernels/cpu/isa.h"
#include "kernels/types.h"

#define PD_DECLARE_VECTOR_OPS                                                             \
  void ConvertRow(const void* in, DType in_dtype, void* out, DType out_dtype, int64_t n); \
  void SiluMulRow(const float* gate, const float* up, float* out, int64_t n);             \
  void AddRow(const float* a, const float* b, float* out, int64_t n);

namespace pd::kernels::cpu::scalar {
PD_DECLARE_VECTOR_OPS
}  // namespace pd::kernels::cpu::scalar
#if PD_CPU_X86
namespace pd::kernels::cpu::avx2 {
PD_DECLARE_VECTOR_OPS
}  // namespace pd::kernels::cpu::avx2
namespace pd::kernels::cpu::avx512 {
PD_DECLARE_VECTOR_OPS
}  // namespace pd::kernels::cpu::avx512
#endif

#undef PD_DECLARE_VECTOR_OPS
