// Which backends the two-process conformance fixture (two_process_test.cc) runs: each test
// binary links one definition of TwoProcessParams() (two_process_params.cc for the CI
// backends, gpu_two_process_params.cc for NCCL and UCX over GPU memory). Test-only.
#pragma once

#include <ostream>
#include <string>
#include <vector>

#include "transport/kv_transport.h"

namespace pd::transport::conformance {

struct TwoProcessParam {
  std::string name;
  std::string backend;
  std::string ucx_tls;                    // empty: UCX defaults
  std::string ucx_data_path = "auto";     // auto | rma | am (both processes)
  MemoryKind memory = MemoryKind::kHost;  // kCuda: cudaMalloc pools
  int local_device = 0;                   // kCuda: the sender's device (this process)
  int peer_device = 1;                    // kCuda: the receiver's device (the peer process)
  // kHost pools on both sides: heap (new[]) | transport (KvTransport::AllocateHost).
  std::string pool_memory = "heap";
};

inline void PrintTo(const TwoProcessParam& p, std::ostream* os) { *os << p.name; }

std::vector<TwoProcessParam> TwoProcessParams();

}  // namespace pd::transport::conformance
