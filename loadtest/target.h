// Connecting to the load test's target: channels, and the readiness check that runs before any
// load (so an unreachable or empty target is one clear error, not thousands of failed requests).
#pragma once

#include <grpcpp/channel.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "pd/v1/generation.pb.h"
#include "services/base/grpc_security.h"

namespace pd::loadtest {

// `count` channels to `target` ("host:port"), each its own HTTP/2 connection (they do not share
// subchannels), with `security`'s TLS and headers; null = plaintext without headers.
std::vector<std::shared_ptr<grpc::Channel>> MakeChannels(
    const std::string& target, int count,
    std::shared_ptr<const services::ClientSecurity> security = nullptr);

// Waits up to `timeout` for the channel to connect, then calls ListModels (same deadline) and
// returns the served model `model` ("" = the default, i.e. the first listed).
// Errors, each naming `target`: Unavailable when it cannot be reached in time or serves no
// model yet; NotFound when `model` is not listed (the message lists what is); the status of a
// failed ListModels otherwise.
absl::StatusOr<pdserve::v1::ModelInfo> ProbeTarget(const std::shared_ptr<grpc::Channel>& channel,
                                                   absl::string_view target,
                                                   absl::string_view model, absl::Duration timeout);

}  // namespace pd::loadtest
