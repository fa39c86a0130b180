#include "transport/registry.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "build_config.h"
#include "common/base/status_macros.h"
#include "transport/tcp/tcp_transport.h"
#include "transport/testing/loopback_transport.h"
#if PD_WITH_UCX
#include "transport/ucx/ucx_transport.h"
#endif
#if PD_WITH_NCCL
#include "transport/nccl/nccl_transport.h"
#endif

namespace pd::transport {
namespace {

using Factory = absl::StatusOr<std::unique_ptr<KvTransport>> (*)(const TransportConfig&);

struct Entry {
  const char* name;
  Factory factory;     // null when not built
  const char* option;  // the CMake option that builds it
};

absl::StatusOr<std::unique_ptr<KvTransport>> MakeLoopback(const TransportConfig& config) {
  return std::unique_ptr<KvTransport>(LoopbackTransport::Create(config.loopback_hub));
}

absl::StatusOr<std::unique_ptr<KvTransport>> MakeTcp(const TransportConfig& config) {
  TcpTransportOptions o;
  o.listen_host = config.listen_host;
  o.listen_port = config.listen_port;
  o.connect_timeout = config.connect_timeout;
  return CreateTcpTransport(o);
}

#if PD_WITH_UCX
absl::StatusOr<std::unique_ptr<KvTransport>> MakeUcx(const TransportConfig& config) {
  UcxTransportOptions o;
  o.listen_host = config.listen_host;
  o.listen_port = config.listen_port;
  o.connect_timeout = config.connect_timeout;
  o.ucp_options = config.ucx_options;
  o.data_path = config.ucx_data_path;
  o.blocking_progress = config.ucx_blocking_progress;
  return CreateUcxTransport(o);
}
#endif

#if PD_WITH_NCCL
absl::StatusOr<std::unique_ptr<KvTransport>> MakeNccl(const TransportConfig& config) {
  NcclTransportOptions o;
  o.listen_host = config.listen_host;
  o.listen_port = config.listen_port;
  o.connect_timeout = config.connect_timeout;
  o.device = config.cuda_device;
  return CreateNcclTransport(o);
}
#endif

constexpr Entry kEntries[] = {
    {"loopback", &MakeLoopback, ""},
    {"tcp", &MakeTcp, ""},
#if PD_WITH_UCX
    {"ucx", &MakeUcx, "PD_ENABLE_UCX"},
#else
    {"ucx", nullptr, "PD_ENABLE_UCX"},
#endif
#if PD_WITH_NCCL
    {"nccl", &MakeNccl, "PD_ENABLE_NCCL"},
#else
    {"nccl", nullptr, "PD_ENABLE_NCCL"},
#endif
};

const Entry* FindEntry(absl::string_view name) {
  for (const Entry& e : kEntries) {
    if (name == e.name) {
      return &e;
    }
  }
  return nullptr;
}

}  // namespace

absl::Status TransportConfig::Validate() const {
  if (backend.empty()) {
    return absl::InvalidArgumentError("transport config: empty backend name");
  }
  if (listen_port < 0 || listen_port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("transport config: listen_port ", listen_port, " out of range"));
  }
  if (cuda_device < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("transport config: cuda_device ", cuda_device, " is negative"));
  }
  if (connect_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("transport config: connect_timeout must be positive");
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<KvTransport>> CreateTransport(const TransportConfig& config) {
  PD_RETURN_IF_ERROR(config.Validate());
  const Entry* e = FindEntry(config.backend);
  if (e == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown transport '", config.backend,
                     "'; known: ", absl::StrJoin(KnownTransports(), ", ")));
  }
  if (e->factory == nullptr) {
    return absl::UnimplementedError(absl::StrCat("transport '", e->name,
                                                 "' is not built into this binary; configure "
                                                 "with -D",
                                                 e->option, "=ON"));
  }
  return e->factory(config);
}

std::vector<std::string> KnownTransports() {
  std::vector<std::string> names;
  for (const Entry& e : kEntries) {
    names.push_back(e.name);
  }
  return names;
}

bool IsTransportBuilt(absl::string_view name) {
  const Entry* e = FindEntry(name);
  return e != nullptr && e->factory != nullptr;
}

}  // namespace pd::transport
