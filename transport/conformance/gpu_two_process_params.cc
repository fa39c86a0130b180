// Two-process conformance over cudaMalloc pools (label gpu): NCCL with this process (sender) on
// device 0 and the peer (receiver) on device 1, skipped without two CUDA devices; UCX with both
// on device 0, skipped without a device or without a CUDA-capable UCX.
#include "transport/conformance/two_process_params.h"

namespace pd::transport::conformance {

std::vector<TwoProcessParam> TwoProcessParams() {
  TwoProcessParam p;
  p.name = "nccl_cuda";
  p.backend = "nccl";
  p.memory = MemoryKind::kCuda;
  p.local_device = 0;
  p.peer_device = 1;
  TwoProcessParam u;
  u.name = "ucx_cuda";
  u.backend = "ucx";
  u.memory = MemoryKind::kCuda;
  u.local_device = 0;
  u.peer_device = 0;
  return {p, u};
}

}  // namespace pd::transport::conformance
