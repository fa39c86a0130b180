#include "services/worker/status_rpcs.h"

#include "services/base/grpc_status.h"

namespace pd::worker {
namespace {

namespace iv1 = pdserve::internal::v1;

template <typename Response, typename Answer>
grpc::ServerUnaryReactor* Serve(const WorkerContext& ctx, grpc::CallbackServerContext* context,
                                absl::string_view rpc, Response* response, Answer answer) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  const absl::Status auth = ctx.cluster_auth.Check(*context, rpc);
  if (auth.ok()) {
    *response = answer();
  }
  reactor->Finish(services::ToGrpcStatus(auth));
  return reactor;
}

}  // namespace

grpc::ServerUnaryReactor* ServeGetLoad(const WorkerContext& ctx,
                                       grpc::CallbackServerContext* context, absl::string_view rpc,
                                       iv1::WorkerLoad* response) {
  return Serve(ctx, context, rpc, response, [&ctx] { return ctx.Load(); });
}

grpc::ServerUnaryReactor* ServeGetInfo(const WorkerContext& ctx,
                                       grpc::CallbackServerContext* context, absl::string_view rpc,
                                       iv1::WorkerInfo* response) {
  return Serve(ctx, context, rpc, response, [&ctx] { return ctx.Info(); });
}

}  // namespace pd::worker
