// Validation and device dispatch for SiluMul, Add and ScaledScatterAdd.
#include "kernels/elementwise.h"

#include "absl/strings/str_cat.h"
#include "build_config.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/dispatch/validate.h"
#if PD_WITH_CUDA
#include "kernels/cuda/cuda_backend.h"
#endif

namespace pd::kernels {

using dispatch_internal::Overlaps;
using dispatch_internal::Span;

namespace {

// An output may be exactly an input (same start, same stride) or disjoint from it. Rows of the
// same stride interleaved in each other's gaps are disjoint too: SiluMul in place on a fused
// [rows][gate | up] projection writes gate's halves while reading up's.
bool BadAlias(const float* out, int64_t out_stride, const float* in, int64_t in_stride,
              int64_t rows, int64_t dim) {
  if (out == in && out_stride == in_stride) {
    return false;
  }
  if (out_stride == in_stride && rows > 1) {
    // in starts m floats into one of out's rows (0 <= m < stride): its rows sit in out's gaps
    // when they start at least dim past out's row start and end by the next one's.
    const int64_t delta = in - out;
    const int64_t m = ((delta % out_stride) + out_stride) % out_stride;
    if (m >= dim && out_stride - m >= dim) {
      return false;
    }
  }
  return Overlaps(out, Span(rows, out_stride, dim) * 4, in, Span(rows, in_stride, dim) * 4);
}

}  // namespace

bool SupportsElementwise(Device device) {
  switch (device) {
    case Device::kCpu:
      return true;
    case Device::kCuda:
      return PD_WITH_CUDA;
  }
  return false;
}

absl::Status SiluMul(const OpContext& ctx, const SiluMulParams& p) {
  if (p.gate == nullptr || p.up == nullptr || p.out == nullptr) {
    return absl::InvalidArgumentError("silu_mul: null gate, up or out");
  }
  if (p.num_rows <= 0 || p.dim <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("silu_mul: num_rows and dim must be > 0, got ", p.num_rows, " x ", p.dim));
  }
  if (p.gate_row_stride < p.dim || p.up_row_stride < p.dim || p.out_row_stride < p.dim) {
    return absl::InvalidArgumentError(absl::StrCat("silu_mul: row strides (", p.gate_row_stride,
                                                   ", ", p.up_row_stride, ", ", p.out_row_stride,
                                                   ") < dim ", p.dim));
  }
  if (BadAlias(p.out, p.out_row_stride, p.gate, p.gate_row_stride, p.num_rows, p.dim) ||
      BadAlias(p.out, p.out_row_stride, p.up, p.up_row_stride, p.num_rows, p.dim)) {
    return absl::InvalidArgumentError("silu_mul: out partly overlaps gate or up");
  }
  if (!SupportsElementwise(ctx.device)) {
    return dispatch_internal::NoBackend("silu_mul", ctx.device, DType::kF32);
  }
#if PD_WITH_CUDA
  if (ctx.device == Device::kCuda) {
    return cuda::SiluMul(ctx, p);
  }
#endif
  cpu::SiluMul(ctx, p);
  return absl::OkStatus();
}

absl::Status Add(const OpContext& ctx, const AddParams& p) {
  if (p.a == nullptr || p.b == nullptr || p.out == nullptr) {
    return absl::InvalidArgumentError("add: null a, b or out");
  }
  if (p.n <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("add: n must be > 0, got ", p.n));
  }
  if (BadAlias(p.out, p.n, p.a, p.n, 1, p.n) || BadAlias(p.out, p.n, p.b, p.n, 1, p.n)) {
    return absl::InvalidArgumentError("add: out partly overlaps a or b");
  }
  if (!SupportsElementwise(ctx.device)) {
    return dispatch_internal::NoBackend("add", ctx.device, DType::kF32);
  }
#if PD_WITH_CUDA
  if (ctx.device == Device::kCuda) {
    return cuda::Add(ctx, p);
  }
#endif
  cpu::Add(ctx, p);
  return absl::OkStatus();
}

absl::Status ScaledScatterAdd(const OpContext& ctx, const ScaledScatterAddParams& p) {
  if (p.num_rows == 0) {
    return absl::OkStatus();  // an expert no token was routed to
  }
  if (p.in == nullptr || p.rows == nullptr || p.weights == nullptr || p.out == nullptr) {
    return absl::InvalidArgumentError("scaled_scatter_add: null in, rows, weights or out");
  }
  if (p.num_rows < 0 || p.dim <= 0 || p.out_rows <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("scaled_scatter_add: need num_rows >= 0, dim > 0 and out_rows > 0, got ",
                     p.num_rows, ", ", p.dim, " and ", p.out_rows));
  }
  if (p.in_row_stride < p.dim || p.out_row_stride < p.dim) {
    return absl::InvalidArgumentError(absl::StrCat("scaled_scatter_add: row strides (",
                                                   p.in_row_stride, ", ", p.out_row_stride,
                                                   ") < dim ", p.dim));
  }
  if (Overlaps(p.out, Span(p.out_rows, p.out_row_stride, p.dim) * 4, p.in,
               Span(p.num_rows, p.in_row_stride, p.dim) * 4)) {
    return absl::InvalidArgumentError("scaled_scatter_add: out overlaps in");
  }
  if (!SupportsElementwise(ctx.device)) {
    return dispatch_internal::NoBackend("scaled_scatter_add", ctx.device, DType::kF32);
  }
#if PD_WITH_CUDA
  if (ctx.device == Device::kCuda) {
    return cuda::ScaledScatterAdd(ctx, p);
  }
#endif
  for (int64_t i = 0; i < p.num_rows; ++i) {  // host memory on kCpu
    if (p.rows[i] < 0 || p.rows[i] >= p.out_rows) {
      return absl::InvalidArgumentError(absl::StrCat(
          "scaled_scatter_add: rows[", i, "] = ", p.rows[i], " outside [0, ", p.out_rows, ")"));
    }
  }
  cpu::ScaledScatterAdd(ctx, p);
  return absl::OkStatus();
}

}  // namespace pd::kernels
