#include "services/base/metrics_http_server.h"

#include <arpa/inet.h>
#include <httplib.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/base/status_macros.h"
#include "common/log/log.h"

namespace pd::services {
namespace {

constexpr char kPrometheusContentType[] = "text/plain; version=0.0.4; charset=utf-8";
// Scrapes are rare and cheap: two workers are plenty, and fewer threads start and stop faster.
constexpr size_t kNumWorkers = 2;
// Bounds how long Stop() waits on an idle keep-alive connection (httplib rechecks between
// requests only). Prometheus scrapes every 15 s or so, so reuse across scrapes is lost anyway.
constexpr time_t kKeepAliveTimeoutSeconds = 1;

std::string HostPort(const std::string& address, int port) {
  if (absl::StrContains(address, ':')) {
    return absl::StrCat("[", address, "]:", port);  // IPv6
  }
  return absl::StrCat(address, ":", port);
}

absl::Status BindError(const std::string& address, int port, int err) {
  std::string reason = err != 0 ? absl::AsciiStrToLower(std::strerror(err)) : "bind failed";
  std::string message =
      absl::StrCat("metrics http: cannot bind ", HostPort(address, port), ": ", reason);
  switch (err) {
    case EADDRINUSE:
      return absl::UnavailableError(message);
    case EACCES:
    case EPERM:
      return absl::PermissionDeniedError(message);
    default:
      return absl::FailedPreconditionError(message);
  }
}

// Only SO_REUSEADDR (restart while old connections sit in TIME_WAIT). httplib's default also sets
// SO_REUSEPORT, which would let a second process bind the same port and split the scrapes.
void SetSocketOptions(int sock) {
  int yes = 1;
  if (::setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes)) != 0) {
    PLOG(WARNING) << "metrics http: setsockopt(SO_REUSEADDR)";
  }
}

}  // namespace

absl::Status MetricsHttpServerConfig::Validate() const {
  in6_addr addr;
  if (::inet_pton(AF_INET, bind_address.c_str(), &addr) != 1 &&
      ::inet_pton(AF_INET6, bind_address.c_str(), &addr) != 1) {
    return absl::InvalidArgumentError(absl::StrCat("metrics http: bind_address \"", bind_address,
                                                   "\" is not a numeric IPv4 or IPv6 address"));
  }
  if (port < 0 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("metrics http: port ", port, " is out of range [0, 65535]"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<MetricsHttpServer>> MetricsHttpServer::Start(
    const MetricsHttpServerConfig& config, const metrics::Registry* registry) {
  PD_RETURN_IF_ERROR(config.Validate());
  if (registry == nullptr) {
    return absl::InvalidArgumentError("metrics http: registry is null");
  }

  auto server = std::make_unique<httplib::Server>();
  // httplib takes ownership of the returned queue (its API hands out a raw pointer).
  server->new_task_queue = [] { return new httplib::ThreadPool(kNumWorkers); };
  server->set_socket_options(SetSocketOptions);
  server->set_keep_alive_timeout(kKeepAliveTimeoutSeconds);
  // Handlers run on the worker threads.
  server->Get("/metrics", [registry](const httplib::Request&, httplib::Response& res) {
    res.set_content(registry->RenderPrometheus(), kPrometheusContentType);
  });
  server->Get("/healthz", [](const httplib::Request&, httplib::Response& res) {
    res.set_content("ok", "text/plain; charset=utf-8");
  });

  // httplib reports a failed bind as false/-1; errno still holds the cause from bind()/listen()
  // (the close() that follows succeeds and leaves errno alone).
  errno = 0;
  int port = config.port;
  bool bound = false;
  if (port == 0) {
    port = server->bind_to_any_port(config.bind_address);
    bound = port > 0;
  } else {
    bound = server->bind_to_port(config.bind_address, port);
  }
  if (!bound) {
    return BindError(config.bind_address, config.port, errno);
  }

  std::unique_ptr<MetricsHttpServer> http(
      new MetricsHttpServer(std::move(server), config.bind_address, port));
  LOG(INFO) << "metrics http: serving /metrics on " << HostPort(config.bind_address, port);
  return http;
}

MetricsHttpServer::MetricsHttpServer(std::unique_ptr<httplib::Server> server,
                                     std::string bind_address, int port)
    : server_(std::move(server)), bind_address_(std::move(bind_address)), port_(port) {
  absl::MutexLock lock(&mu_);
  thread_ = std::thread([this] {
    if (!server_->listen_after_bind()) {
      LOG(ERROR) << "metrics http: accept loop on " << HostPort(bind_address_, port_)
                 << " ended with an error";
    }
    // Release pairs with the acquire load in the wait loop below.
    accept_loop_exited_.store(true, std::memory_order_release);
  });
  // httplib's stop() is a no-op until the accept loop has started (is_running()), so a Stop()
  // issued before that would leave the thread listening forever: wait for the loop to start.
  // This takes microseconds; the loop sets is_running() before its first accept().
  while (!server_->is_running() && !accept_loop_exited_.load(std::memory_order_acquire)) {
    absl::SleepFor(absl::Microseconds(50));
  }
}

MetricsHttpServer::~MetricsHttpServer() { Stop(); }

void MetricsHttpServer::Stop() {
  absl::MutexLock lock(&mu_);
  if (!thread_.joinable()) {
    return;
  }
  server_->stop();
  thread_.join();
  LOG(INFO) << "metrics http: stopped on " << HostPort(bind_address_, port_);
}

}  // namespace pd::services
