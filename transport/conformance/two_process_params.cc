// The backends CI runs two-process conformance for (host memory).
#include "transport/conformance/two_process_params.h"

namespace pd::transport::conformance {

std::vector<TwoProcessParam> TwoProcessParams() {
  return {TwoProcessParam{"tcp", "tcp", ""},
          TwoProcessParam{"ucx_shm_self_tcp", "ucx", "shm,self,tcp"},
          TwoProcessParam{"ucx_rma_shm_self_tcp", "ucx", "shm,self,tcp", "rma"},
          TwoProcessParam{"ucx_am_shm_self_tcp", "ucx", "shm,self,tcp", "am"},
          TwoProcessParam{"ucx_tcp", "ucx", "tcp"},
          TwoProcessParam{"ucx_am_tcp", "ucx", "tcp", "am"}};
}

}  // namespace pd::transport::conformance
