#include "kernels/cpu/vector_ops.h"

#include <cstring>

#include "kernels/cpu/simd.h"

namespace pd::kernels::cpu::scalar {
#include "kernels/cpu/vector_ops.inc"
}  // namespace pd::kernels::cpu::scalar

#if PD_CPU_X86
PD_BEGIN_TARGET_AVX2
namespace pd::kernels::cpu::avx2 {
#include "kernels/cpu/vector_ops.inc"
}  // namespace pd::kernels::cpu::avx2
PD_END_TARGET

PD_BEGIN_TARGET_AVX512
namespace pd::kernels::cpu::avx512 {
#include "kernels/cpu/vector_ops.inc"
}  // namespace pd::kernels::cpu::avx512
PD_END_TARGET
#endif
