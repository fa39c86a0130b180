// NCCL backend skeleton: compiles and links against CUDA and NCCL here; the data path
// (ncclSend/ncclRecv over a communicator bootstrapped through the TCP endpoint) is not written
// yet. TODO(#4): communicator bootstrap, send/recv per coalesced run, completion events.
#include "transport/nccl/nccl_transport.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include "absl/strings/str_cat.h"

namespace pd::transport {

int NcclUsableDeviceCount() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    return 0;  // no driver (cudaErrorInsufficientDriver) or no device
  }
  return n;
}

absl::StatusOr<std::unique_ptr<KvTransport>> CreateNcclTransport(const NcclTransportOptions&) {
  if (NcclUsableDeviceCount() == 0) {
    return absl::FailedPreconditionError("nccl transport: no usable CUDA device");
  }
  int version = 0;
  ncclGetVersion(&version);
  return absl::UnimplementedError(
      absl::StrCat("nccl transport (NCCL ", version, "): data path not implemented yet"));
}

}  // namespace pd::transport
