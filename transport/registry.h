// CreateTransport: builds a KvTransport backend by name from a plain config struct
// (docs/development.md, "Backend interfaces"). Names: "loopback" (in-process fake), "tcp" (always
// built), "ucx" (PD_ENABLE_UCX), "nccl" (PD_ENABLE_NCCL). A known but unbuilt backend answers
// Unimplemented naming the CMake option; an unknown name is InvalidArgument.
//
// There is no shared metadata store (a directory where backends publish their endpoints): no
// backend here needs one, since endpoints and descriptors travel in the control-plane RPC. Add
// an optional pointer to TransportConfig when a backend starts publishing itself.
//
// Thread-safe (stateless).
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "transport/kv_transport.h"
#include "transport/ucx_data_path.h"

namespace pd::transport {

class LoopbackHub;

struct TransportConfig {
  std::string backend = "tcp";

  // tcp and ucx: the listening socket address (numeric IPv4; port 0 picks a free one).
  std::string listen_host = "127.0.0.1";
  int listen_port = 0;
  absl::Duration connect_timeout = absl::Seconds(5);

  // ucx: UCP configuration overrides applied with ucp_config_modify (names without the UCX_
  // prefix, e.g. {"TLS", "shm,self,tcp"}); never read from or written to the environment by
  // the library (UCX itself still honours UCX_* variables the process was started with).
  std::vector<std::pair<std::string, std::string>> ucx_options;
  UcxDataPath ucx_data_path = UcxDataPath::kAuto;  // see transport/ucx_data_path.h
  // ucx: a progress thread sleeps on the worker's event fd when idle (false: busy-poll).
  bool ucx_blocking_progress = true;

  // nccl: the CUDA device whose pools this transport moves and whose communicators it creates
  // (one device per transport; the two ends of a connection must be on different GPUs).
  int cuda_device = 0;

  // loopback: the in-process hub connecting transports; a fresh one when null.
  // Shared by every loopback transport attached to it.
  std::shared_ptr<LoopbackHub> loopback_hub;

  // InvalidArgument for an empty backend name or a bad port.
  absl::Status Validate() const;
};

absl::StatusOr<std::unique_ptr<KvTransport>> CreateTransport(const TransportConfig& config);

// Every name the registry knows, built or not.
std::vector<std::string> KnownTransports();
// Whether `name` is known and compiled into this binary.
bool IsTransportBuilt(absl::string_view name);

}  // namespace pd::transport
