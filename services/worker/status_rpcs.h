// GetLoad and GetInfo, which DecodeService and PrefillService both serve, and serve alike: the
// cluster token is checked under the RPC's own name (`rpc`, e.g. "DecodeService.GetLoad", what
// the auth error names), then the answer is the worker's WorkerContext::Load() or Info(). Each
// function finishes the call's default reactor and returns it.
//
// Thread-safe: the WorkerContext is only read.
#pragma once

#include <grpcpp/grpcpp.h>

#include "absl/strings/string_view.h"
#include "pd/v1/worker.pb.h"
#include "services/worker/worker_context.h"

namespace pd::worker {

grpc::ServerUnaryReactor* ServeGetLoad(const WorkerContext& ctx,
                                       grpc::CallbackServerContext* context, absl::string_view rpc,
                                       pdserve::internal::v1::WorkerLoad* response);

grpc::ServerUnaryReactor* ServeGetInfo(const WorkerContext& ctx,
                                       grpc::CallbackServerContext* context, absl::string_view rpc,
                                       pdserve::internal::v1::WorkerInfo* response);

}  // namespace pd::worker
