#include "services/worker/prefill_peer.h"

#include <grpcpp/grpcpp.h>

#include <utility>

#include "pd/v1/worker.grpc.pb.h"
#include "services/base/grpc_status.h"

namespace pd::worker {
namespace {

namespace iv1 = pdserve::internal::v1;

// One PrefillService.Prefill call in flight; owned by its completion callback.
struct PrefillCall {
  grpc::ClientContext client;
  iv1::PrefillRequest request;
  iv1::PrefillResponse response;
  PrefillPeer::Done done;
};

class GrpcPrefillPeer final : public PrefillPeer {
 public:
  explicit GrpcPrefillPeer(std::unique_ptr<iv1::PrefillService::Stub> stub)
      : stub_(std::move(stub)) {}

  void Prefill(iv1::PrefillRequest request, absl::Time deadline, Done done) override {
    // Raw until the callback takes it: gRPC's callback must be copyable (no unique_ptr).
    auto* call = new PrefillCall();
    call->request = std::move(request);
    call->done = std::move(done);
    call->client.set_deadline(absl::ToChronoTime(deadline));
    stub_->async()->Prefill(&call->client, &call->request, &call->response,
                            [call](grpc::Status status) {  // a gRPC thread
                              std::unique_ptr<PrefillCall> owned(call);
                              owned->done(services::FromGrpcStatus(status),
                                          std::move(owned->response));
                            });
  }

 private:
  const std::unique_ptr<iv1::PrefillService::Stub> stub_;
};

}  // namespace

GrpcPrefillPeers::GrpcPrefillPeers(std::shared_ptr<const services::ClientSecurity> security)
    : security_(security != nullptr ? std::move(security) : services::ClientSecurity::Insecure()) {}

GrpcPrefillPeers::~GrpcPrefillPeers() = default;

PrefillPeer* GrpcPrefillPeers::Get(const std::string& address) {
  absl::MutexLock lock(&mu_);
  std::unique_ptr<PrefillPeer>& peer = peers_[address];
  if (peer == nullptr) {
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(64 << 20);
    // A restarted prefill worker is found again within a second.
    args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
    args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
    args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
    peer = std::make_unique<GrpcPrefillPeer>(
        iv1::PrefillService::NewStub(security_->CreateChannel(address, args)));
  }
  return peer.get();
}

}  // namespace pd::worker
