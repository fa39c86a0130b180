// ServeUntilShutdown: the tail every service main() shares once its server is up — serve
// /metrics, log one "serving" line, wait for SIGTERM/SIGINT, drain, stop /metrics.
#pragma once

#include <string>

#include "absl/functional/function_ref.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/metrics/metrics.h"
#include "services/base/net_address.h"
#include "services/base/shutdown_signal.h"

namespace pd::services {

// Starts the Prometheus /metrics and /healthz server on `metrics_address` over `registry`
// (a failure is a startup error: ExitWithStartupError(program, ...)), logs
// "<program> serving: <describe>; metrics on HOST:PORT", blocks until `shutdown` fires, then
// calls `drain(drain_timeout)` and stops the HTTP server. Returns main()'s exit status (0).
int ServeUntilShutdown(absl::string_view program, ShutdownSignal& shutdown,
                       metrics::Registry* registry, const HostPort& metrics_address,
                       absl::Duration drain_timeout, const std::string& describe,
                       absl::FunctionRef<void(absl::Duration)> drain);

}  // namespace pd::services
