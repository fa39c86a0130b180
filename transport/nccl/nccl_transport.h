// NcclTransport: KV blocks between GPU pools with NCCL send/recv (built when PD_ENABLE_NCCL is
// on). nccl.h and cuda_runtime.h appear only in this folder's .cc files. Private to
// transport/: use the registry.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "transport/kv_transport.h"

namespace pd::transport {

struct NcclTransportOptions {
  std::string listen_host = "127.0.0.1";
  int listen_port = 0;
  absl::Duration connect_timeout = absl::Seconds(5);
};

// FailedPrecondition when no CUDA device is usable.
absl::StatusOr<std::unique_ptr<KvTransport>> CreateNcclTransport(
    const NcclTransportOptions& options);

// Number of usable CUDA devices (0 without a driver or device).
int NcclUsableDeviceCount();

}  // namespace pd::transport
