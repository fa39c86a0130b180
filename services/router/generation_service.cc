#include "services/router/generation_service.h"

#include <string>

#include "common/base/status_macros.h"
#include "common/log/log.h"
#include "services/base/grpc_status.h"

namespace pd::router {
namespace {

// Ends a server stream at once with `status` (no messages).
class FinishedWriter final : public grpc::ServerWriteReactor<pdserve::v1::GenerateResponse> {
 public:
  explicit FinishedWriter(const grpc::Status& status) { Finish(status); }
  void OnDone() override { delete this; }  // gRPC's reactor ownership contract
};

}  // namespace

absl::StatusOr<std::unique_ptr<GenerationService>> GenerationService::Create(
    RequestLimits limits, metrics::Registry* metrics) {
  PD_RETURN_IF_ERROR(limits.Validate());
  PD_ASSIGN_OR_RETURN(
      metrics::Family<metrics::Counter> * requests,
      metrics->AddCounter("pd_router_requests_total",
                          "Public API calls by method and final gRPC status code",
                          {"method", "code"}));
  return std::unique_ptr<GenerationService>(new GenerationService(limits, requests));
}

void GenerationService::Count(absl::string_view method, const absl::Status& status) {
  requests_->WithLabels({std::string(method), absl::StatusCodeToString(status.code())})
      .Increment();
}

grpc::ServerWriteReactor<pdserve::v1::GenerateResponse>* GenerationService::Generate(
    grpc::CallbackServerContext* /*context*/, const pdserve::v1::GenerateRequest* request) {
  absl::Status status = ValidateGenerateRequest(*request, limits_);
  if (status.ok()) {
    // TODO(#5): route to a decode worker (and prefill worker) and stream tokens back.
    status = absl::UnimplementedError(
        "generation is not available yet: pd-router needs the model engine (issue #3) and the "
        "disaggregated cluster path (issue #5)");
  }
  VLOG(1) << "Generate client_request_id=" << request->client_request_id() << ": " << status;
  Count("Generate", status);
  return new FinishedWriter(services::ToGrpcStatus(status));
}

grpc::ServerUnaryReactor* GenerationService::ListModels(
    grpc::CallbackServerContext* context, const pdserve::v1::ListModelsRequest* /*request*/,
    pdserve::v1::ListModelsResponse* /*response*/) {
  // No worker registry yet (#5): the router serves no model until workers register.
  Count("ListModels", absl::OkStatus());
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

}  // namespace pd::router
