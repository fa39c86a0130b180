#include "loadtest/target.h"

#include <grpcpp/client_context.h>
#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/support/channel_arguments.h>

#include <chrono>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "pd/v1/generation.grpc.pb.h"
#include "services/base/grpc_status.h"

namespace pd::loadtest {

namespace v1 = ::pdserve::v1;

std::vector<std::shared_ptr<grpc::Channel>> MakeChannels(
    const std::string& target, int count,
    std::shared_ptr<const services::ClientSecurity> security) {
  if (security == nullptr) security = services::ClientSecurity::Insecure();
  std::vector<std::shared_ptr<grpc::Channel>> channels;
  for (int i = 0; i < count; ++i) {
    grpc::ChannelArguments args;
    // Channels with equal arguments share one connection through the global subchannel pool;
    // a local pool and a distinct argument give each channel its own.
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    args.SetInt("pd.loadtest.channel_index", i);
    args.SetMaxReceiveMessageSize(-1);
    channels.push_back(security->CreateChannel(target, args));
  }
  return channels;
}

absl::StatusOr<v1::ModelInfo> ProbeTarget(const std::shared_ptr<grpc::Channel>& channel,
                                          absl::string_view target, absl::string_view model,
                                          absl::Duration timeout) {
  const auto deadline = std::chrono::system_clock::now() + absl::ToChronoNanoseconds(timeout);
  if (!channel->WaitForConnected(deadline)) {
    return absl::UnavailableError(absl::StrCat("cannot connect to target ", target, " within ",
                                               absl::FormatDuration(timeout),
                                               " (--connect_timeout): is the server running?"));
  }
  auto stub = v1::Generation::NewStub(channel);
  grpc::ClientContext context;
  context.set_deadline(deadline);
  v1::ListModelsRequest request;
  v1::ListModelsResponse response;
  const grpc::Status status = stub->ListModels(&context, request, &response);
  if (!status.ok()) {
    const absl::Status s = services::FromGrpcStatus(status);
    return absl::Status(s.code(),
                        absl::StrCat("target ", target, ": ListModels failed: ", s.message()));
  }
  if (response.models().empty()) {
    return absl::UnavailableError(absl::StrCat(
        "target ", target, " serves no model yet (ListModels is empty: no healthy worker?)"));
  }
  if (model.empty()) {
    return response.models(0);
  }
  std::vector<std::string> ids;
  for (const v1::ModelInfo& m : response.models()) {
    if (m.id() == model) {
      return m;
    }
    ids.push_back(m.id());
  }
  return absl::NotFoundError(absl::StrCat("target ", target, " does not serve model '", model,
                                          "' (it serves: ", absl::StrJoin(ids, ", "), ")"));
}

}  // namespace pd::loadtest
