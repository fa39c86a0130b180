// Two-process conformance for NCCL: cudaMalloc pools, this process (sender) on device 0, the
// peer (receiver) on device 1. Skipped without two CUDA devices (label gpu).
#include "transport/conformance/two_process_params.h"

namespace pd::transport::conformance {

std::vector<TwoProcessParam> TwoProcessParams() {
  TwoProcessParam p;
  p.name = "nccl_cuda";
  p.backend = "nccl";
  p.memory = MemoryKind::kCuda;
  p.local_device = 0;
  p.peer_device = 1;
  return {p};
}

}  // namespace pd::transport::conformance
