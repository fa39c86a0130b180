// The public pdserve.v1.Generation service of pd-router (gRPC callback API).
//
// Today it validates requests and answers ListModels from the registered workers; Generate on
// a valid request returns UNIMPLEMENTED until the engine (#3) and the cluster path (#5) land.
// Thread-safety: handlers run on gRPC's callback threads; the class is thread-safe.
#pragma once

#include "common/metrics/metrics.h"
#include "pd/v1/generation.grpc.pb.h"
#include "services/router/request_validation.h"

namespace pd::router {

class GenerationService final : public pdserve::v1::Generation::CallbackService {
 public:
  // `metrics` must outlive the service. Registers pd_router_requests_total.
  static absl::StatusOr<std::unique_ptr<GenerationService>> Create(RequestLimits limits,
                                                                   metrics::Registry* metrics);

  grpc::ServerWriteReactor<pdserve::v1::GenerateResponse>* Generate(
      grpc::CallbackServerContext* context, const pdserve::v1::GenerateRequest* request) override;

  grpc::ServerUnaryReactor* ListModels(grpc::CallbackServerContext* context,
                                       const pdserve::v1::ListModelsRequest* request,
                                       pdserve::v1::ListModelsResponse* response) override;

 private:
  GenerationService(RequestLimits limits, metrics::Family<metrics::Counter>* requests)
      : limits_(limits), requests_(requests) {}

  void Count(absl::string_view method, const absl::Status& status);

  const RequestLimits limits_;
  metrics::Family<metrics::Counter>* requests_;  // owned by the registry
};

}  // namespace pd::router
