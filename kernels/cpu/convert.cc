#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/vector_ops.h"

namespace pd::kernels::cpu {

void Convert(const OpContext& ctx, const ConvertParams& p) {
  const int in_size = DTypeSize(p.in_dtype), out_size = DTypeSize(p.out_dtype);
  // Chunks of >= 64K elements: below that one thread streams faster than two wake up.
  ParallelRange(ctx, p.n, int64_t{1} << 16, [&](int64_t begin, int64_t end) {
    PD_ISA_DISPATCH(ConvertRow(static_cast<const char*>(p.in) + begin * in_size, p.in_dtype,
                               static_cast<char*>(p.out) + begin * out_size, p.out_dtype,
                               end - begin));
  });
}

}  // namespace pd::kernels::cpu
