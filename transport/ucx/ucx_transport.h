// UcxTransport: the UCX KvTransport backend (built when PD_ENABLE_UCX is on). UCX headers
// appear only in this folder's .cc files. Private to transport/: use the registry.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "transport/kv_transport.h"
#include "transport/ucx_data_path.h"

namespace pd::transport {

struct UcxTransportOptions {
  std::string listen_host = "127.0.0.1";
  int listen_port = 0;
  absl::Duration connect_timeout = absl::Seconds(5);
  std::vector<std::pair<std::string, std::string>> ucp_options;  // ucp_config_modify
  UcxDataPath data_path = UcxDataPath::kAuto;
  bool blocking_progress = true;
};

absl::StatusOr<std::unique_ptr<KvTransport>> CreateUcxTransport(const UcxTransportOptions& options);

}  // namespace pd::transport
