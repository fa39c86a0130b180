#include "kernels/cuda/cuda_backend.h"

#include "absl/strings/str_cat.h"
#include "kernels/cuda/cuda_kernels.h"

namespace pd::kernels::cuda {
namespace {

absl::Status FromCuda(cudaError_t err, const char* what) {
  if (err == cudaSuccess) {
    return absl::OkStatus();
  }
  return absl::InternalError(absl::StrCat(what, ": ", cudaGetErrorName(err), " (",
                                          cudaGetErrorString(err), ")"));
}

}  // namespace

absl::Status RmsNorm(const OpContext& ctx, const RmsNormParams& p) {
  return FromCuda(LaunchRmsNorm(p, static_cast<cudaStream_t>(ctx.stream)), "rms_norm launch");
}

int VisibleDeviceCount() {
  int count = 0;
  // cudaErrorInsufficientDriver / cudaErrorNoDevice on machines without a GPU: report 0.
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    return 0;
  }
  return count;
}

}  // namespace pd::kernels::cuda
