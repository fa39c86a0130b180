#include "services/base/serve.h"

#include "common/log/log.h"
#include "services/base/metrics_http_server.h"
#include "services/base/startup.h"

namespace pd::services {

int ServeUntilShutdown(absl::string_view program, ShutdownSignal& shutdown,
                       metrics::Registry* registry, const HostPort& metrics_address,
                       absl::Duration drain_timeout, const std::string& describe,
                       absl::FunctionRef<void(absl::Duration)> drain) {
  absl::StatusOr<std::unique_ptr<MetricsHttpServer>> http =
      MetricsHttpServer::Start({metrics_address.host, metrics_address.port}, registry);
  if (!http.ok()) {
    ExitWithStartupError(program, http.status());
  }
  LOG(INFO) << program << " serving: " << describe << "; metrics on " << metrics_address.host
            << ":" << (*http)->port();
  shutdown.Wait();
  LOG(INFO) << "draining (up to " << drain_timeout << ")";
  drain(drain_timeout);
  (*http)->Stop();
  LOG(INFO) << program << " stopped";
  return 0;
}

}  // namespace pd::services
