// DecodeService (proto/pd/v1/worker.proto): runs a request on this worker's engine and streams
// its tokens, with the prompt prefilled by the prefill worker the router named (RemotePrefill,
// falling back to a local prefill) or locally, after restoring what the node's tiers hold
// (tier_restore.h).
//
// Thread-safety: handlers run on gRPC callback threads; engine outputs on the engine loop
// thread. Thread-safe.
#pragma once

#include "pd/v1/worker.grpc.pb.h"
#include "services/worker/prefill_peer.h"
#include "services/worker/worker_context.h"

namespace pd::worker {

class DecodeServiceImpl final : public pdserve::internal::v1::DecodeService::CallbackService {
 public:
  // `ctx` must outlive the service.
  explicit DecodeServiceImpl(WorkerContext* ctx) : ctx_(ctx), prefill_peers_(ctx->peer_security) {}

  grpc::ServerWriteReactor<pdserve::internal::v1::DecodeResponse>* Generate(
      grpc::CallbackServerContext* context,
      const pdserve::internal::v1::DecodeRequest* request) override;
  grpc::ServerUnaryReactor* GetLoad(grpc::CallbackServerContext* context,
                                    const pdserve::internal::v1::GetLoadRequest* request,
                                    pdserve::internal::v1::WorkerLoad* response) override;
  grpc::ServerUnaryReactor* GetInfo(grpc::CallbackServerContext* context,
                                    const pdserve::internal::v1::GetInfoRequest* request,
                                    pdserve::internal::v1::WorkerInfo* response) override;

 private:
  WorkerContext* ctx_;
  GrpcPrefillPeers prefill_peers_;
};

}  // namespace pd::worker
