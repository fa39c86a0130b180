#include "services/router/router_server.h"

#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/log/log.h"

namespace pd::router {

absl::StatusOr<std::unique_ptr<RouterServer>> RouterServer::Start(const RouterConfig& config,
                                                                  metrics::Registry* metrics) {
  PD_RETURN_IF_ERROR(config.Validate());
  std::unique_ptr<RouterServer> server(new RouterServer());
  server->config_ = config;
  if (config.redis.has_value()) {
    absl::StatusOr<std::unique_ptr<redis::RedisClient>> client =
        redis::RedisClient::Connect(*config.redis);
    if (!client.ok()) {
      return absl::Status(client.status().code(),
                          absl::StrCat("--redis_address: ", client.status().message()));
    }
    server->redis_ = *std::move(client);
  }
  PD_RETURN_IF_ERROR(services::CheckCanListen(config.grpc_address, "--grpc_address"));
  PD_ASSIGN_OR_RETURN(server->generation_, GenerationService::Create(config.limits, metrics));

  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  builder.AddListeningPort(config.grpc_address.ToString(), grpc::InsecureServerCredentials(),
                           &server->port_);
  builder.RegisterService(server->generation_.get());
  server->server_ = builder.BuildAndStart();
  if (server->server_ == nullptr || server->port_ == 0) {
    return absl::UnavailableError(
        absl::StrCat("--grpc_address ", config.grpc_address.ToString(), ": cannot start server"));
  }
  server->server_->GetHealthCheckService()->SetServingStatus(true);
  return server;
}

RouterServer::~RouterServer() { Drain(absl::ZeroDuration()); }

std::string RouterServer::address() const {
  return services::HostPort{config_.grpc_address.host, port_}.ToString();
}

void RouterServer::Drain(absl::Duration timeout) {
  if (server_ == nullptr) {
    return;
  }
  server_->GetHealthCheckService()->SetServingStatus(false);
  server_->Shutdown(absl::ToChronoTime(absl::Now() + timeout));
  server_->Wait();
  server_.reset();
}

}  // namespace pd::router
