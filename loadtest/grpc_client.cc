#include "loadtest/grpc_client.h"

#include <grpcpp/client_context.h>
#include <grpcpp/support/async_stream.h>

#include <algorithm>
#include <chrono>

#include "absl/strings/strip.h"
#include "common/log/log.h"
#include "services/base/grpc_status.h"

namespace pd::loadtest {

namespace v1 = ::pdserve::v1;

// One Generate stream driven through a completion queue: StartCall -> Read ... Read (not ok at
// the end of the stream) -> Finish. Owns its context, request and response. Exactly one
// operation is pending at a time, so its events are handled one after another (on the polling
// thread of its queue) and need no lock.
class GrpcClient::Call : public InFlight {
 public:
  enum class Op { kStart, kRead, kFinish };

  // The tag of an operation: the completion queue hands it back with the event.
  struct Tag {
    Call* call;
    Op op;
  };

  Call(RequestSink* sink, RequestRecord record) : sink_(sink), record_(std::move(record)) {
    record_.itl_ns.reserve(static_cast<size_t>(std::max<int64_t>(record_.max_tokens - 1, 0)));
  }

  v1::GenerateRequest& request() { return request_; }
  grpc::ClientContext& context() { return context_; }
  int target() const { return record_.target; }

  void Cancel() override { context_.TryCancel(); }

  // Starts the stream on `cq`. Events follow on the queue's polling thread.
  void Start(v1::Generation::Stub* stub, grpc::CompletionQueue* cq) {
    reader_ = stub->PrepareAsyncGenerate(&context_, request_, cq);
    record_.start_ns = sink_->NowNs();
    reader_->StartCall(&start_tag_);
  }

  // Handles one event. Returns true when the stream is over and the call may be deleted.
  bool Proceed(Op op, bool ok) {
    switch (op) {
      case Op::kStart:
      case Op::kRead:
        if (!ok) {
          // Failed start or end of stream: the status comes with Finish.
          reader_->Finish(&status_, &finish_tag_);
          return false;
        }
        if (op == Op::kRead) {
          OnMessage();
        }
        reader_->Read(&response_, &read_tag_);
        return false;
      case Op::kFinish:
        OnDone();
        return true;
    }
    return false;
  }

 private:
  void OnMessage() {
    const int64_t now = sink_->NowNs();
    const int k = response_.token_ids_size();
    if (k > 0) {
      if (record_.first_token_ns < 0) {
        record_.first_token_ns = now;
      } else {
        const int64_t gap = (now - last_token_ns_) / k;
        record_.itl_ns.insert(record_.itl_ns.end(), static_cast<size_t>(k), gap);
      }
      last_token_ns_ = now;
      record_.output_tokens += k;
      sink_->AddOutputTokens(k);
    }
    if (response_.finish_reason() != v1::FINISH_REASON_UNSPECIFIED) {
      const std::string& name = v1::FinishReason_Name(response_.finish_reason());
      record_.finish_reason = std::string(absl::StripPrefix(name, "FINISH_REASON_"));
      if (response_.has_usage()) {
        record_.has_usage = true;
        record_.prompt_tokens = response_.usage().prompt_tokens();
        record_.cached_tokens = response_.usage().cached_tokens();
        record_.completion_tokens = response_.usage().completion_tokens();
      }
    }
  }

  void OnDone() {
    record_.end_ns = sink_->NowNs();
    if (!status_.ok()) {
      record_.code = services::FromGrpcStatus(status_).code();
      record_.error = status_.error_message();
    } else if (record_.finish_reason.empty()) {
      // The API promises a final message with a finish reason; its absence is a server bug.
      record_.code = absl::StatusCode::kInternal;
      record_.error = "stream ended OK without a finish reason";
    }
    sink_->Finished(this, std::move(record_));
  }

  RequestSink* const sink_;
  RequestRecord record_;
  int64_t last_token_ns_ = 0;
  Tag start_tag_{this, Op::kStart};
  Tag read_tag_{this, Op::kRead};
  Tag finish_tag_{this, Op::kFinish};
  grpc::ClientContext context_;
  v1::GenerateRequest request_;
  v1::GenerateResponse response_;
  grpc::Status status_;
  std::unique_ptr<grpc::ClientAsyncReader<v1::GenerateResponse>> reader_;
};

GrpcClient::GrpcClient(RequestSink* sink, GrpcClientOptions options,
                       std::vector<std::shared_ptr<grpc::Channel>> channels0,
                       std::vector<std::shared_ptr<grpc::Channel>> channels1)
    : sink_(sink), options_(std::move(options)) {
  for (auto& channel : channels0) {
    stubs_[0].push_back(v1::Generation::NewStub(channel));
    channels_.push_back(std::move(channel));
  }
  for (auto& channel : channels1) {
    stubs_[1].push_back(v1::Generation::NewStub(channel));
    channels_.push_back(std::move(channel));
  }
  for (int i = 0; i < options_.num_threads; ++i) {
    cqs_.push_back(std::make_unique<grpc::CompletionQueue>());
    pollers_.emplace_back([cq = cqs_.back().get()] { Poll(cq); });
  }
}

GrpcClient::~GrpcClient() {
  for (auto& cq : cqs_) {
    cq->Shutdown();
  }
  for (std::thread& t : pollers_) {
    t.join();
  }
}

void GrpcClient::Poll(grpc::CompletionQueue* cq) {
  void* tag = nullptr;
  bool ok = false;
  while (cq->Next(&tag, &ok)) {
    Call::Tag* t = static_cast<Call::Tag*>(tag);
    if (t->call->Proceed(t->op, ok)) {
      delete t->call;
    }
  }
}

std::unique_ptr<InFlight> GrpcClient::Prepare(RequestSpec& spec, bool move_prompt,
                                              const RequestParams& params, RequestRecord record) {
  CHECK(!stubs_[record.target].empty()) << "no gRPC channel for target " << record.target;
  auto call = std::make_unique<Call>(sink_, std::move(record));
  v1::GenerateRequest& req = call->request();
  req.set_model(options_.model);
  req.mutable_token_ids()->mutable_ids()->Assign(spec.prompt.begin(), spec.prompt.end());
  if (move_prompt) {
    spec.prompt.clear();
  }
  req.mutable_sampling()->set_max_tokens(static_cast<uint32_t>(spec.output_len));
  req.mutable_sampling()->set_ignore_eos(options_.ignore_eos);
  if (options_.temperature != 0) {
    req.mutable_sampling()->set_temperature(static_cast<float>(options_.temperature));
  }
  if (!options_.json_schema.empty()) {
    req.mutable_sampling()->mutable_constraint()->set_json_schema(options_.json_schema);
  }
  const SamplingPenalties& pen = options_.penalties;
  req.mutable_sampling()->set_presence_penalty(static_cast<float>(pen.presence_penalty));
  req.mutable_sampling()->set_frequency_penalty(static_cast<float>(pen.frequency_penalty));
  req.mutable_sampling()->set_repetition_penalty(static_cast<float>(pen.repetition_penalty));
  req.mutable_sampling()->set_min_p(static_cast<float>(pen.min_p));
  req.set_client_request_id(params.client_request_id);
  if (!params.cache_salt.empty()) {
    req.set_cache_salt(params.cache_salt);
  }
  if (options_.request_timeout > absl::ZeroDuration()) {
    call->context().set_deadline(std::chrono::system_clock::now() +
                                 absl::ToChronoNanoseconds(options_.request_timeout));
  }
  return call;
}

void GrpcClient::Start(std::unique_ptr<InFlight> request) {
  Call* call = static_cast<Call*>(request.release());  // deleted by Poll after Finish
  const int target = call->target();
  v1::Generation::Stub* stub = stubs_[target][next_stub_[target]].get();
  next_stub_[target] = (next_stub_[target] + 1) % stubs_[target].size();
  grpc::CompletionQueue* cq = cqs_[next_cq_].get();
  next_cq_ = (next_cq_ + 1) % cqs_.size();
  call->Start(stub, cq);
}

}  // namespace pd::loadtest
