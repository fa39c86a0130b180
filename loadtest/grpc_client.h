// GrpcClient: the RequestClient of pdserve.v1.Generation targets (pd-router), on gRPC's
// completion-queue async streams (grpc::ClientAsyncReader). Any number of streams in flight
// are driven by `num_threads` polling threads (one CompletionQueue each; the thread that polls
// runs the handler, with no hand-off to an executor). Every request sends token ids with
// max_tokens = the workload's output length and ignore_eos, so output lengths are as specified.
// One client may serve both targets of a comparison (a group of channels each).
//
// Thread-safety: as RequestClient; stream events are handled on the polling threads.
#pragma once

#include <grpcpp/channel.h>
#include <grpcpp/completion_queue.h>

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/time.h"
#include "loadtest/request_client.h"
#include "loadtest/sampling_penalties.h"
#include "pd/v1/generation.grpc.pb.h"

namespace pd::loadtest {

struct GrpcClientOptions {
  std::string model;  // GenerateRequest.model; "" = the target's default
  absl::Duration request_timeout = absl::Minutes(10);  // gRPC deadline; zero = none
  bool ignore_eos = true;
  double temperature = 0;  // sampling.temperature (0 = greedy, the server's default)
  SamplingPenalties penalties;  // sampling's penalty fields and min_p (zero = unset)
  std::string json_schema;  // sampling.constraint.json_schema when not empty
  int num_threads = 2;     // completion-queue polling threads, >= 1
};

class GrpcClient : public RequestClient {
 public:
  // `channels[t]` connect to target t (0 = the target, 1 = the compare target; either may be
  // empty when that target uses another client); requests to t go round-robin over them.
  GrpcClient(RequestSink* sink, GrpcClientOptions options,
             std::vector<std::shared_ptr<grpc::Channel>> channels0,
             std::vector<std::shared_ptr<grpc::Channel>> channels1);
  // Shuts the queues down and joins the polling threads. Every started request must have
  // finished (the runner waits for them first).
  ~GrpcClient() override;

  std::unique_ptr<InFlight> Prepare(RequestSpec& spec, bool move_prompt,
                                    const RequestParams& params, RequestRecord record) override;
  void Start(std::unique_ptr<InFlight> request) override;

 private:
  class Call;
  // Body of a polling thread: handles the events of `cq` until it is shut down.
  static void Poll(grpc::CompletionQueue* cq);

  RequestSink* const sink_;
  const GrpcClientOptions options_;
  std::vector<std::shared_ptr<grpc::Channel>> channels_;  // both targets'
  std::vector<std::unique_ptr<pdserve::v1::Generation::Stub>> stubs_[2];
  std::vector<std::unique_ptr<grpc::CompletionQueue>> cqs_;
  std::vector<std::thread> pollers_;  // one per cq
  size_t next_stub_[2] = {0, 0};      // issuer thread only
  size_t next_cq_ = 0;                // issuer thread only
};

}  // namespace pd::loadtest
