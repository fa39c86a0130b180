#include <algorithm>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/vector_ops.h"

namespace pd::kernels::cpu {
namespace {

constexpr int64_t kMinChunkElements = 16384;  // below this a fork-join costs more than it saves

}  // namespace

void SiluMul(const OpContext& ctx, const SiluMulParams& p) {
  const int64_t min_rows = std::max<int64_t>(1, kMinChunkElements / p.dim);
  ParallelRange(ctx, p.num_rows, min_rows, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      PD_ISA_DISPATCH(SiluMulRow(p.gate + r * p.gate_row_stride, p.up + r * p.up_row_stride,
                                 p.out + r * p.out_row_stride, p.dim));
    }
  });
}

void Add(const OpContext& ctx, const AddParams& p) {
  ParallelRange(ctx, p.n, kMinChunkElements, [&](int64_t begin, int64_t end) {
    PD_ISA_DISPATCH(AddRow(p.a + begin, p.b + begin, p.out + begin, end - begin));
  });
}

void ScaledScatterAdd(const OpContext& ctx, const ScaledScatterAddParams& p) {
  // Rows are distinct: ranges of them write disjoint outputs. Compiled without FMA (the
  // baseline ISA, as every backend rounds the product first).
  const int64_t min_rows = std::max<int64_t>(1, kMinChunkElements / p.dim);
  ParallelRange(ctx, p.num_rows, min_rows, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const float w = p.weights[i];
      const float* x = p.in + i * p.in_row_stride;
      float* o = p.out + static_cast<int64_t>(p.rows[i]) * p.out_row_stride;
      for (int64_t j = 0; j < p.dim; ++j) {
        const float product = w * x[j];
        o[j] += product;
      }
    }
  });
}

}  // namespace pd::kernels::cpu
