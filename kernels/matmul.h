// MatMul: y = x Wᵀ (+ bias), the linear layers of the model. Validates once, then runs the
// implementation registered for ctx.device.
//
// CPU: a vectorised direct kernel (AVX-512, AVX2 or scalar, chosen at run time) that streams
// each weight row once for a tile of x rows, cache-blocked for many rows, split over output rows
// across ctx.parallel. Each y[r][o] is summed in the same order whatever num_rows is, so results
// are batch invariant. With p.allow_blas, calls of more than 8 rows on CPUs without AVX-512 go
// to OpenBLAS sgemm instead (bf16/f16 weights widened tile by tile into the workspace): ~1.6x
// faster there, not batch invariant. On AVX-512 the direct kernel beats Debian's OpenBLAS (which
// runs its AVX2 kernels) at every size, so allow_blas changes nothing. OpenBLAS is set to one
// thread of its own at first use, process-wide: parallelism comes from ctx.parallel only, so its
// threads and ours never oversubscribe the cores.
//
// int8 weights (W8A8, see kernels/matmul_params.h): exact int32 dot products of quantized rows of
// x and weight rows, AVX-512 VNNI (vpdpbusd), AVX2 or scalar; identical bits on every CPU path
// and the reference, batch invariant. CUDA: its own W8A8 kernel (kernels/cuda/matmul_i8.cu).
//
// CUDA: cuBLAS sgemm (f32 arithmetic, no TF32) on a per-thread, per-device handle; bias and
// accumulate by a small kernel before the GEMM; bf16/f16 weights widened to f32 into the
// (device) workspace one tile of output rows at a time (up to 32 MiB). Not batch invariant.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/matmul_params.h"

namespace pd::kernels {

// Errors: InvalidArgument for null pointers, non-positive sizes, strides smaller than the row
// lengths, overlapping x/y, a workspace smaller than MatMulWorkspaceBytes, int8 weights without
// w_scales or with in_features > kMaxI8InFeatures, or fp8 weights; Unimplemented when no backend
// built for ctx.device supports w_dtype; Internal when a CUDA launch or cuBLAS call fails.
absl::Status MatMul(const OpContext& ctx, const MatMulParams& p);

// Workspace bytes MatMul(ctx, p) needs; depends on the shape, w_dtype, allow_blas, the CPU and
// the number of threads in ctx.parallel (0 unless the sgemm path runs with bf16/f16 weights, or
// the weights are int8: then the quantized rows of x, about num_rows * in_features bytes).
// On kCuda: 0 for f32 weights, else one widened tile of device memory. An
// engine can size one buffer for its largest layer and prefill chunk and pass it to every call.
int64_t MatMulWorkspaceBytes(const OpContext& ctx, const MatMulParams& p);

bool SupportsMatMul(Device device, DType w_dtype);

// Creates what MatMul on ctx.device needs on the calling thread that is created on first use
// (on kCuda: the thread's cuBLAS handle and its workspace, bound to ctx.stream), so that a
// later MatMul captured into a CUDA graph allocates nothing: cublasCreate and cudaMalloc are
// not allowed while a stream captures. A no-op on kCpu and in builds without CUDA. Internal
// when cuBLAS or the allocation fails.
absl::Status PrepareMatMul(const OpContext& ctx);

}  // namespace pd::kernels
