// The conformance suite for NCCL over GPU memory, two transports in one process: the sender
// (and the suite's third transport) on device 0, the receiver on device 1, pools allocated with
// cudaMalloc and checked through cudaMemcpy. Label gpu: every test skips without two CUDA
// devices (NCCL rejects two ranks of one communicator on the same GPU) or without NCCL.
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"

#include "transport/conformance/conformance_suite.h"
#include "transport/registry.h"
#include "transport/testing/test_device_memory.h"

namespace pd::transport::conformance {
namespace {

int DeviceOf(int index) { return index == 1 ? 1 : 0; }

absl::StatusOr<std::unique_ptr<KvTransport>> MakeNccl(int index) {
  TransportConfig c;
  c.backend = "nccl";
  c.cuda_device = DeviceOf(index);
  return CreateTransport(c);
}

std::string SkipReason() {
  if (!IsTransportBuilt("nccl")) {
    return "nccl transport not built (-DPD_ENABLE_NCCL=ON)";
  }
  const int devices = TestDeviceCount();
  if (devices < 2) {
    return absl::StrCat("needs two CUDA devices, ", devices,
                        " usable (NCCL rejects two ranks of one communicator on one GPU)");
  }
  return "";
}

ConformanceParam NcclParam() {
  ConformanceParam p;
  p.name = "nccl_cuda";
  p.make = &MakeNccl;
  p.memory = MemoryKind::kCuda;
  p.device_of = &DeviceOf;
  p.skip_reason = &SkipReason;
  return p;
}

INSTANTIATE_TEST_SUITE_P(Gpu, KvTransportConformance, ::testing::Values(NcclParam()), ParamName);

}  // namespace
}  // namespace pd::transport::conformance
