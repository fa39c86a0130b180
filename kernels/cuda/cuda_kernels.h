// Launchers of the CUDA kernels. Included only by kernels/cuda/*.{cu,cc}; plain param headers
// and CUDA only (no Abseil, glog or protobuf under nvcc).
#pragma once

#include <cuda_runtime.h>

#include "kernels/norm_params.h"

namespace pd::kernels::cuda {

// One thread block per row; f32 only. Returns the launch error (cudaSuccess when queued).
cudaError_t LaunchRmsNorm(const RmsNormParams& p, cudaStream_t stream);

// Threads per block LaunchRmsNorm uses for a row of `dim` elements: a multiple of 32 in
// [32, 1024]. Exposed so the launch-shape logic is testable without a device.
int RmsNormThreadsPerBlock(int64_t dim);

}  // namespace pd::kernels::cuda
