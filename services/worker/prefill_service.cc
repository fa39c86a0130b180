#include "services/worker/prefill_service.h"

#include <grpcpp/grpcpp.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "services/base/grpc_status.h"
#include "services/worker/prefill_job.h"
#include "services/worker/status_rpcs.h"

namespace pd::worker {

namespace iv1 = pdserve::internal::v1;

grpc::ServerUnaryReactor* PrefillServiceImpl::Prefill(grpc::CallbackServerContext* context,
                                                      const iv1::PrefillRequest* request,
                                                      iv1::PrefillResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  WorkerContext* ctx = ctx_;
  // Runs once; `response` lives until Finish.
  auto finish = [ctx, reactor, response](const absl::Status& status, iv1::PrefillResponse result) {
    if (status.ok()) {
      *response = std::move(result);
    }
    ctx->metrics.CountRequest("Prefill.Prefill", status.code());
    reactor->Finish(services::ToGrpcStatus(status));
  };
  if (absl::Status auth = ctx_->cluster_auth.Check(*context, "PrefillService.Prefill");
      !auth.ok()) {
    finish(auth, {});
    return reactor;
  }
  if (ctx_->config.role == WorkerRole::kDecode) {
    finish(absl::FailedPreconditionError(absl::StrCat(
               "worker ", ctx_->worker_id, " runs as decode; it does not serve prefills")),
           {});
    return reactor;
  }
  PrefillJob::Run(ctx_, *request, absl::FromChrono(context->deadline()), std::move(finish));
  return reactor;
}

grpc::ServerUnaryReactor* PrefillServiceImpl::GetLoad(grpc::CallbackServerContext* context,
                                                      const iv1::GetLoadRequest* /*request*/,
                                                      iv1::WorkerLoad* response) {
  return ServeGetLoad(*ctx_, context, "PrefillService.GetLoad", response);
}

grpc::ServerUnaryReactor* PrefillServiceImpl::GetInfo(grpc::CallbackServerContext* context,
                                                      const iv1::GetInfoRequest* /*request*/,
                                                      iv1::WorkerInfo* response) {
  return ServeGetInfo(*ctx_, context, "PrefillService.GetInfo", response);
}

}  // namespace pd::worker
