// The backends CI runs two-process conformance for (host memory).
#include "transport/conformance/two_process_params.h"

namespace pd::transport::conformance {

namespace {

TwoProcessParam MappedParam(std::string name, std::string backend, std::string tls) {
  TwoProcessParam p{std::move(name), std::move(backend), std::move(tls)};
  p.pool_memory = "transport";
  return p;
}

}  // namespace

std::vector<TwoProcessParam> TwoProcessParams() {
  return {TwoProcessParam{"tcp", "tcp", ""},
          TwoProcessParam{"ucx_shm_self_tcp", "ucx", "shm,self,tcp"},
          TwoProcessParam{"ucx_rma_shm_self_tcp", "ucx", "shm,self,tcp", "rma"},
          TwoProcessParam{"ucx_am_shm_self_tcp", "ucx", "shm,self,tcp", "am"},
          TwoProcessParam{"ucx_tcp", "ucx", "tcp"},
          TwoProcessParam{"ucx_am_tcp", "ucx", "tcp", "am"},
          // Pools from AllocateHost: over shm, kAuto puts into the peer's UCX segment.
          MappedParam("ucx_mapped_shm_self_tcp", "ucx", "shm,self,tcp"),
          MappedParam("ucx_mapped_tcp", "ucx", "tcp"), MappedParam("tcp_mapped", "tcp", "")};
}

}  // namespace pd::transport::conformance
