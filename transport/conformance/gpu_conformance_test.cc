// The conformance suite over GPU memory (pools allocated with cudaMalloc, filled and checked
// through cudaMemcpy), two transports in one process. Label gpu; every test skips where its
// backend cannot run:
//  - nccl: sender (and the suite's third transport) on device 0, receiver on device 1; needs
//    two CUDA devices (NCCL does not support two ranks of one communicator on the same GPU).
//  - ucx: all on device 0 (UCX picks cuda_ipc/cuda_copy); needs a UCX built with CUDA support
//    (Debian's is not: there Register(kCuda) is Unimplemented, see ucx_transport_test).
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
                        " usable (NCCL does not support two ranks of one communicator on one GPU)");
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

absl::StatusOr<std::unique_ptr<KvTransport>> MakeUcx(int /*index*/) {
  TransportConfig c;
  c.backend = "ucx";
  return CreateTransport(c);
}

std::string UcxSkipReason() {
  if (!IsTransportBuilt("ucx")) {
    return "ucx transport not built (-DPD_ENABLE_UCX=ON)";
  }
  if (TestDeviceCount() < 1) {
    return "no CUDA device";
  }
  absl::StatusOr<std::unique_ptr<KvTransport>> t = MakeUcx(0);
  if (!t.ok()) {
    return absl::StrCat("ucx transport: ", t.status().ToString());
  }
  if (!(*t)->Caps().cuda_memory) {
    return "this UCX has no CUDA memory support (no cuda_copy/cuda_ipc)";
  }
  return "";
}

ConformanceParam UcxCudaParam() {
  ConformanceParam p;
  p.name = "ucx_cuda";
  p.make = &MakeUcx;
  p.memory = MemoryKind::kCuda;
  p.device_of = [](int) { return 0; };
  p.skip_reason = &UcxSkipReason;
  return p;
}

INSTANTIATE_TEST_SUITE_P(Gpu, KvTransportConformance,
                         ::testing::Values(NcclParam(), UcxCudaParam()), ParamName);

}  // namespace
}  // namespace pd::transport::conformance
