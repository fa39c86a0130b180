// PrefillService (proto/pd/v1/worker.proto): prefills a decode worker's prompt into that
// worker's blocks. The gRPC adapter of PrefillJob (prefill_job.h), which does the work.
//
// Thread-safety: handlers run on gRPC callback threads. Thread-safe.
#pragma once

#include "pd/v1/worker.grpc.pb.h"
#include "services/worker/worker_context.h"

namespace pd::worker {

class PrefillServiceImpl final : public pdserve::internal::v1::PrefillService::CallbackService {
 public:
  // `ctx` must outlive the service.
  explicit PrefillServiceImpl(WorkerContext* ctx) : ctx_(ctx) {}

  grpc::ServerUnaryReactor* Prefill(grpc::CallbackServerContext* context,
                                    const pdserve::internal::v1::PrefillRequest* request,
                                    pdserve::internal::v1::PrefillResponse* response) override;
  grpc::ServerUnaryReactor* GetLoad(grpc::CallbackServerContext* context,
                                    const pdserve::internal::v1::GetLoadRequest* request,
                                    pdserve::internal::v1::WorkerLoad* response) override;
  grpc::ServerUnaryReactor* GetInfo(grpc::CallbackServerContext* context,
                                    const pdserve::internal::v1::GetInfoRequest* request,
                                    pdserve::internal::v1::WorkerInfo* response) override;

 private:
  WorkerContext* ctx_;
};

}  // namespace pd::worker
