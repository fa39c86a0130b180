// Instantiates the conformance suite for every backend built here, two instances in one
// process (unit label). The two-process runs are in two_process_test.cc.
#include <memory>
#include <vector>

#include "transport/conformance/conformance_suite.h"
#include "transport/registry.h"
#include "transport/testing/fault_injecting_transport.h"
#include "transport/testing/loopback_transport.h"

namespace pd::transport::conformance {
namespace {

// One hub per test process is enough: loopback transports only meet through Connect.
std::shared_ptr<LoopbackHub> Hub() {
  static auto* hub = new std::shared_ptr<LoopbackHub>(std::make_shared<LoopbackHub>());
  return *hub;
}

absl::StatusOr<std::unique_ptr<KvTransport>> MakeLoopback(int /*group*/) {
  TransportConfig c;
  c.backend = "loopback";
  c.loopback_hub = Hub();
  return CreateTransport(c);
}

absl::StatusOr<std::unique_ptr<KvTransport>> MakeFaultFreeDecorator(int group) {
  absl::StatusOr<std::unique_ptr<KvTransport>> inner = MakeLoopback(group);
  if (!inner.ok()) {
    return inner;
  }
  return std::unique_ptr<KvTransport>(
      std::make_unique<FaultInjectingTransport>(*std::move(inner), FaultPolicy{}));
}

absl::StatusOr<std::unique_ptr<KvTransport>> MakeTcp(int /*group*/) {
  TransportConfig c;
  c.backend = "tcp";
  return CreateTransport(c);
}

absl::StatusOr<std::unique_ptr<KvTransport>> MakeUcx(const char* tls, UcxDataPath path) {
  TransportConfig c;
  c.backend = "ucx";
  c.ucx_options.push_back({"TLS", tls});
  c.ucx_data_path = path;
  return CreateTransport(c);
}

// Backends that are not built are simply not instantiated (the registry test covers their
// Unimplemented answer).
std::vector<ConformanceParam> UcxParams() {
  if (!IsTransportBuilt("ucx")) {
    return {};
  }
  return {
      ConformanceParam{"ucx_shm_self_tcp",
                       [](int) { return MakeUcx("shm,self,tcp", UcxDataPath::kAuto); }},
      ConformanceParam{"ucx_rma_shm_self_tcp",
                       [](int) { return MakeUcx("shm,self,tcp", UcxDataPath::kRma); }},
      ConformanceParam{"ucx_am_shm_self_tcp",
                       [](int) { return MakeUcx("shm,self,tcp", UcxDataPath::kActiveMessage); }},
      ConformanceParam{"ucx_tcp", [](int) { return MakeUcx("tcp", UcxDataPath::kAuto); }},
      ConformanceParam{"ucx_am_tcp",
                       [](int) { return MakeUcx("tcp", UcxDataPath::kActiveMessage); }}};
}

INSTANTIATE_TEST_SUITE_P(Ucx, KvTransportConformance, ::testing::ValuesIn(UcxParams()), ParamName);
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(KvTransportConformance);

INSTANTIATE_TEST_SUITE_P(InProcess, KvTransportConformance,
                         ::testing::Values(ConformanceParam{"loopback", &MakeLoopback},
                                           ConformanceParam{"loopback_via_fault_decorator",
                                                            &MakeFaultFreeDecorator},
                                           ConformanceParam{"tcp", &MakeTcp}),
                         ParamName);

}  // namespace
}  // namespace pd::transport::conformance
